"""Owner-check pairing, outlier flags, signed accusation records and the ban rule (issue 6 point 4)."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
import torch

from peers.keys.signing import Signer, peer_id_from_public_der
from peers.reducers import build_reducer
from peers.rounds.owner_check import fit_reducer
from peers.trust.suspicion import AccusationTable, compute_bans, decode_signed, encode_signed
from peers.trust.verify import outlier_rows, verified_partition, verifier_index
from swarmtrain.core.errors import ConfigError, ProtocolError

RUN = "t-susp"


@pytest.fixture(scope="module")
def signers(tmp_path_factory: pytest.TempPathFactory) -> list[Signer]:
    from peers.keys.identity import ensure_identity

    out = []
    for i in range(2):
        path = tmp_path_factory.mktemp("id") / f"id{i}.key"
        pid = ensure_identity(path)
        s = Signer(path)
        assert s.peer_id == pid  # the signing key is the one behind the libp2p peer ID
        out.append(s)
    return out


@pytest.mark.parametrize("n", [2, 3, 6, 7])
def test_verifier_pairing_is_a_rotating_derangement(n: int) -> None:
    partners: dict[int, set[int]] = {i: set() for i in range(n)}
    for r in range(3 * n):
        vs = [verifier_index(n, i, r) for i in range(n)]
        assert sorted(vs) == list(range(n))  # each member verifies exactly one partition
        for i, v in enumerate(vs):
            assert v != i
            assert verified_partition(n, v, r) == i
            partners[i].add(v)
    for i in range(n):  # over the rounds every owner meets every other member as its verifier
        assert partners[i] == set(range(n)) - {i}
    assert verifier_index(1, 0, 5) == -1


def test_outlier_rows_flags_sign_flipped_rows_only() -> None:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(500, generator=g)
    honest = base + 0.3 * torch.randn(4, 500, generator=g)
    stack = torch.cat([honest, -3.0 * base[None], -base[None] + 0.3 * torch.randn(1, 500, generator=g)])
    agg = build_reducer("centered_clip", 2).reduce(stack, torch.ones(6))
    assert outlier_rows(stack, agg) == [4, 5]
    assert outlier_rows(honest, honest.mean(0)) == []


def _table(
    failures: list[tuple[int, str, str]] | None = None, outliers: dict[str, list[int]] | None = None
) -> AccusationTable:
    return AccusationTable(list(failures or []), dict(outliers or {}))


def test_owner_ban_needs_f_plus_one_accusers_and_partners() -> None:
    f = 1
    # the liar L mismatches with rotating verifiers A, B; every peer reports it
    events = [(0, "L", "A"), (1, "L", "B")]
    tables = {p: _table(events) for p in ("A", "B", "C", "L")}
    bans = compute_bans(tables, f)
    assert set(bans) == {"L"} and "owner check" in bans["L"]
    # one event only: L has a single partner, so nobody is banned (A might be the liar as well)
    assert compute_bans({p: _table(events[:1]) for p in "ABC"}, f) == {}
    # f lying accusers cannot frame two honest peers, however many events they invent
    forged = [(r, "A", "B") for r in range(20)] + [(r, "A", "C") for r in range(20)]
    assert compute_bans({"L": _table(forged), "A": _table(), "B": _table(), "C": _table()}, f) == {}


def test_honest_peer_paired_with_liars_is_not_banned() -> None:
    f = 2  # two liars L1, L2 both mismatch with honest H: H has 2 distinct partners, needs 3
    events = [(0, "L1", "H"), (1, "L2", "H"), (2, "L1", "A"), (3, "L1", "B")]
    tables = {p: _table(events) for p in ("H", "A", "B", "C")}
    assert set(compute_bans(tables, f)) == {"L1"}


def test_outlier_ban_needs_repeated_flags_from_f_plus_one_peers() -> None:
    f = 1
    often = {"X": [5, 6], "Y": [1, 6]}
    tables = {"A": _table(outliers=often), "B": _table(outliers=often), "C": _table(outliers={"X": [2, 6]})}
    bans = compute_bans(tables, f, strikes=3)
    assert set(bans) == {"X"} and "outlier" in bans["X"]
    # a single accuser (up to f) is not enough, nor are flags in a minority of rounds
    assert compute_bans({"A": _table(outliers={"Y": [9, 9]})}, f) == {}
    assert compute_bans({p: _table(outliers={"Y": [4, 10]}) for p in "ABC"}, f) == {}
    # self-accusations do not count
    assert compute_bans({"X": _table(outliers={"X": [9, 9]}), "A": _table(outliers={"X": [9, 9]})}, f) == {}
    with pytest.raises(ConfigError):
        compute_bans({}, -1)


def test_signed_record_roundtrip_and_forgeries_rejected(signers: list[Signer]) -> None:
    a, b = signers
    t = _table([(3, "P", "Q")], {"P": [4, 5]})
    value = encode_signed(RUN, t, a)
    back = decode_signed(RUN, a.peer_id, value)
    assert back.owner_failures == t.owner_failures and back.outliers == t.outliers
    # stored under somebody else's subkey
    with pytest.raises(ProtocolError):
        decode_signed(RUN, b.peer_id, value)
    # b signs but claims to be a: its key does not hash to a's peer ID
    obj = msgpack.unpackb(encode_signed(RUN, t, b), raw=False)
    obj["a"] = a.peer_id
    with pytest.raises(ProtocolError, match="not the key of the claimed peer ID"):
        decode_signed(RUN, a.peer_id, msgpack.packb(obj, use_bin_type=True))
    # a's key and ID, but the body was altered after signing
    obj = msgpack.unpackb(value, raw=False)
    obj["b"] = msgpack.packb(_table(outliers={"Q": [9, 9]}).to_obj(), use_bin_type=True)
    with pytest.raises(ProtocolError, match="signature"):
        decode_signed(RUN, a.peer_id, msgpack.packb(obj, use_bin_type=True))
    # a record replayed into another run
    with pytest.raises(ProtocolError, match="signature"):
        decode_signed("other-run", a.peer_id, value)
    for junk in (b"", b"\x93\x01\x02\x03", 5, b"x" * 70_000):
        with pytest.raises(ProtocolError):
            decode_signed(RUN, a.peer_id, junk)
    assert peer_id_from_public_der(a.public_der) == a.peer_id


def test_table_validation_bounds() -> None:
    with pytest.raises(ProtocolError):
        AccusationTable.from_obj({"o": [[1, "a"]], "x": {}})
    with pytest.raises(ProtocolError):
        AccusationTable.from_obj({"o": [], "x": {"a": [3, 2]}})  # more flags than rounds seen
    t = AccusationTable()
    for r in range(1000):
        t.add_owner_failure(r, "a", "b")
    assert len(t.owner_failures) == 256 and t.owner_failures[-1][0] == 999


def test_signer_rejects_a_non_key(tmp_path: Path) -> None:
    p = tmp_path / "k"
    p.write_bytes(b"not a key")
    with pytest.raises(ConfigError):
        Signer(p)


def test_fit_reducer_clamps_f_to_the_group() -> None:
    red = build_reducer("centered_clip", 2)
    assert fit_reducer(red, 6) is red
    small = fit_reducer(red, 3)
    assert small.n_byzantine == 1 and red.n_byzantine == 2  # type: ignore[attr-defined]
    small.reduce(torch.randn(3, 4), torch.ones(3))
    assert fit_reducer(build_reducer("mean"), 1).n_byzantine == 0  # type: ignore[attr-defined]
