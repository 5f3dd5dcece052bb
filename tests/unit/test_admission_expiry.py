"""Admission with a lifetime (issue 30.3): a token's expiry ends a peer's admission, the run key
revokes tokens, and a leader's group list admits nobody (``peers.trust.admitted``,
``peers.trust.revocation``, ``peers.rounds.collective``). Pure logic with an injected clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from peers.rounds.group import Group, group_digest
from peers.rounds.round_errors import ListsBannedPeer
from peers.trust.admission import Admission, RunKey
from peers.trust.admitted import UNVERIFIED_S, AdmittedPeers, token_fields, token_of_record
from peers.trust.revocation import decode_revocation, sign_revocation

RUN = "t-life"
T0 = 1_000_000.0


@dataclass
class Rec:
    peer_id: str
    extra: dict[str, Any] = field(default_factory=dict)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def run_key(tmp_path: Path) -> RunKey:
    return RunKey.generate(tmp_path / "run.key")


def _policy(key: RunKey) -> Admission:
    return Admission("token", RUN, run_public=bytes.fromhex(key.public_hex))


def _rec(key: RunKey, peer: str, expires: float) -> Rec:
    return Rec(peer, dict(token_fields(key.issue(RUN, peer, expires))))


def test_a_record_carries_what_rebuilds_its_writers_token(run_key: RunKey) -> None:
    token = run_key.issue(RUN, "A", T0 + 10)
    fields = token_fields(token)
    assert all(len(str(v)) <= 128 for v in fields.values())  # fits a peer record's extra
    assert token_of_record(RUN, "A", fields) == token
    assert token_of_record(RUN, "A", {}) is None and token_fields(None) == {}


def test_admission_ends_at_the_tokens_expiry_and_a_renewed_token_admits_again(run_key: RunKey) -> None:
    clock = Clock()
    records = [_rec(run_key, "A", T0 + 10)]
    reads: list[int] = []

    def lookup() -> list[Rec]:
        reads.append(1)
        return list(records)

    peers = AdmittedPeers(_policy(run_key), lookup, min_interval=0.0, clock=clock)
    assert peers.check("A") and peers.decided("A") is True
    clock.t = T0 + 9.9
    assert peers.decided("A") is True and len(reads) == 1  # cached until the expiry: no read
    clock.t = T0 + 10.5  # expired: re-checked, and its record still shows the expired token
    assert peers.decided("A") is None
    assert not peers.check("A") and len(reads) == 2
    assert "A" in peers.refused()  # rounds leave it out
    records[0] = _rec(run_key, "A", T0 + 100)  # a renewed token
    assert peers.check("A") and "A" not in peers.refused()


def test_a_record_without_token_fields_admits_for_a_short_while_only(run_key: RunKey) -> None:
    clock = Clock()
    peers = AdmittedPeers(_policy(run_key), lambda: [Rec("B")], min_interval=0.0, clock=clock)
    peers.note(["B"])
    assert peers.decided("B") is True
    clock.t = T0 + UNVERIFIED_S + 1
    assert peers.decided("B") is None


def test_a_forged_token_in_a_record_admits_nobody(run_key: RunKey, tmp_path: Path) -> None:
    other = RunKey.generate(tmp_path / "other.key")
    peers = AdmittedPeers(
        _policy(run_key), lambda: [_rec(other, "C", T0 + 1e6)], min_interval=0.0, clock=Clock()
    )
    assert not peers.check("C") and "C" in peers.refused()


def test_a_revocation_signed_by_the_run_key_refuses_its_peer(run_key: RunKey, tmp_path: Path) -> None:
    other = RunKey.generate(tmp_path / "other.key")
    blobs: list[bytes] = []
    clock = Clock()
    records = [_rec(run_key, p, T0 + 1e6) for p in ("A", "B", "C")]
    peers = AdmittedPeers(
        _policy(run_key), lambda: records, min_interval=0.0, revocations=lambda: blobs, clock=clock
    )
    assert peers.check("A") and peers.check("B") and peers.check("C")
    blobs += [
        sign_revocation(other, RUN, "B", T0 + 1e6),  # not the run key: ignored
        sign_revocation(run_key, "another-run", "B", T0 + 1e6),  # another run: ignored
        sign_revocation(run_key, RUN, "C", T0 - 1),  # lapsed: ignored
        b"junk",
        sign_revocation(run_key, RUN, "A", T0 + 1e6),
    ]
    peers.read_revocations()
    assert peers.decided("A") is False and not peers.check("A")  # its valid token no longer counts
    assert peers.check("B") and peers.check("C")
    assert peers.refused() == frozenset({"A"})
    rev = decode_revocation(blobs[-1], bytes.fromhex(run_key.public_hex))
    assert (rev.run_id, rev.peer_id, rev.until) == (RUN, "A", T0 + 1e6)


def _collective(admitted: AdmittedPeers, members: tuple[str, ...]) -> Any:
    from peers.rounds.collective import P2PCollective

    group = Group(
        "reduce", 3, members, members[0], group_digest(RUN, "reduce", 3, members), members.index("B")
    )
    sent: list[str] = []
    c = P2PCollective.__new__(P2PCollective)
    c.node = SimpleNamespace(peer_id="B", admitted=admitted)
    c.guard = None
    c._matchmaker = SimpleNamespace(banned=frozenset(), form_group=lambda *a: group)
    c._link = SimpleNamespace(peer_id="B", run_id=RUN, send=lambda p, *a: sent.append(p))
    c.sent = sent
    return c


def test_a_leaders_list_admits_nobody_this_node_has_not_admitted(run_key: RunKey) -> None:
    """Finding 4b: an admitted leader A lists X, whom this node's own check does not admit: the
    list is refused (the members are told to abort) and X stays unadmitted here."""
    from peers.rounds.round_io import PhaseClock

    records = [_rec(run_key, p, T0 + 1e6) for p in ("A", "B")]
    admitted = AdmittedPeers(_policy(run_key), lambda: records, min_interval=0.0, clock=Clock())
    c = _collective(admitted, ("A", "B", "X"))
    with pytest.raises(ListsBannedPeer, match="does not admit"):
        c._form_group("reduce", 3, 1e12, PhaseClock())
    assert admitted.decided("X") is None and not admitted.check("X")
    assert sorted(c.sent) == ["A", "X"]  # the abort went to the list's other members
    records.append(_rec(run_key, "X", T0 + 1e6))  # once X shows its own token, the list is fine
    assert (
        _collective(admitted, ("A", "B", "X"))._form_group("reduce", 3, 1e12, PhaseClock()).members[2] == "X"
    )


def test_a_revoked_donor_neither_serves_nor_vouches(run_key: RunKey, monkeypatch: pytest.MonkeyPatch) -> None:
    """A newcomer reads the revocations before it picks donors: a revoked donor's announcement and
    its vouch are left out (``peers.state.donors.candidates``)."""
    import peers.state.donors as donors

    digest = b"d" * 32

    def found(
        node: Any, run: str, timeout: float, vouches: dict[str, Any], manifests: Any, *_: Any
    ) -> list[Any]:
        vouches.update({p: frozenset({(5, digest)}) for p in ("A", "B", "R")})
        return [(5, p, b"h" * 32, 10) for p in ("A", "B", "R")]

    monkeypatch.setattr(donors, "announcements", found)
    monkeypatch.setattr(donors, "witnessed", lambda node, run, got, errors: got)
    # the vouching rules (as in a run before commit certificates; the node has no DHT to read them)
    monkeypatch.setattr(donors, "certified_states", lambda *args, **kwargs: None)
    revoked = [sign_revocation(run_key, RUN, "R", T0 + 1e6)]
    admitted = AdmittedPeers(_policy(run_key), list, revocations=lambda: revoked, clock=Clock())
    node = SimpleNamespace(run_id=RUN, admitted=admitted)
    chosen = donors.candidates(node, RUN, frozenset(), 2, [])  # type: ignore[arg-type]
    assert sorted(a[1] for a, _ in chosen) == ["A", "B"] and all(v == digest for _, v in chosen)


def test_a_revoked_accuser_counts_for_no_ban(
    run_key: RunKey, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With ``f = 1`` two accusers ban; one of them revoked, the other alone bans nobody."""
    import peers.rounds.guard as guard
    from peers.keys.identity import ensure_identity
    from peers.keys.signing import Signer
    from peers.trust.suspicion import AccusationTable

    def accusing() -> AccusationTable:
        t = AccusationTable()
        for _ in range(4):
            t.observe("V", True)
        return t

    monkeypatch.setattr(guard, "read_tables", lambda dht, run, timeout: {"H": accusing(), "R": accusing()})
    ensure_identity(tmp_path / "me.key")
    revoked: list[bytes] = []
    admitted = AdmittedPeers(_policy(run_key), list, revocations=lambda: revoked, clock=Clock())
    signer = Signer(tmp_path / "me.key")
    node = SimpleNamespace(signer=signer, peer_id=signer.peer_id, dht=None, run_id=RUN, admitted=admitted)
    g = guard.ByzantineGuard(node, f=1, strikes=3)
    assert "V" in g.refresh()
    revoked.append(sign_revocation(run_key, RUN, "R", T0 + 1e6))
    admitted.read_revocations()
    assert "V" not in g.refresh()
