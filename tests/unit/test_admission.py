"""Admission policies, join tokens and signed DHT records (``peers.trust.admission``,
``peers.dht.dht_records``).

Pure logic on hivemind's record type; the real-peer proof (an outsider's records ignored by a run)
is ``tests/integration/test_intruders.py``.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import pytest
from hivemind.dht.validation import DHTRecord

from peers.dht.dht_records import MAX_RECORD_BYTES, SignedRecords
from peers.keys.identity import ensure_identity
from peers.keys.signing import Signer
from peers.trust.admission import (
    Admission,
    NotAdmitted,
    RunKey,
    admission_from,
    decode_token,
    encode_token_text,
    own_token,
    parse_token_text,
)
from swarmtrain.core.config import PeersConfig
from swarmtrain.core.errors import ConfigError, ProtocolError

RUN = "t-admit"


@pytest.fixture(scope="module")
def signers(tmp_path_factory: pytest.TempPathFactory) -> list[Signer]:
    d = tmp_path_factory.mktemp("ids")
    out = []
    for i in range(3):
        ensure_identity(d / f"{i}.key")
        out.append(Signer(d / f"{i}.key"))
    return out


@pytest.fixture()
def run_key(tmp_path: Path) -> RunKey:
    return RunKey.generate(tmp_path / "run.key")


def test_run_key_file_is_private_and_never_overwritten(tmp_path: Path) -> None:
    key = RunKey.generate(tmp_path / "run.key")
    assert (tmp_path / "run.key").stat().st_mode & 0o777 == 0o600
    assert RunKey.load(tmp_path / "run.key").public_hex == key.public_hex
    with pytest.raises(ConfigError, match="never overwritten"):
        RunKey.generate(tmp_path / "run.key")
    (tmp_path / "junk").write_bytes(b"not a key")
    with pytest.raises(ConfigError, match="not a run key"):
        RunKey.load(tmp_path / "junk")


def test_token_admits_its_peer_in_its_run_until_it_expires(run_key: RunKey) -> None:
    pub = bytes.fromhex(run_key.public_hex)
    adm = Admission("token", RUN, run_public=pub)
    tok = run_key.issue(RUN, "PeerA", time.time() + 60)
    adm.check("PeerA", tok)
    assert parse_token_text(encode_token_text(tok)) == tok
    for peer, token, why in [
        ("PeerB", tok, "another run or peer"),
        ("PeerA", run_key.issue("other-run", "PeerA", time.time() + 60), "another run or peer"),
        ("PeerA", run_key.issue(RUN, "PeerA", time.time() - 1), "expired"),
        ("PeerA", None, "no join token"),
        ("PeerA", b"\x92\xc4\x01a\xc4\x01b", "body"),
        ("PeerA", b"\xff" * 600, "too large"),
    ]:
        with pytest.raises(NotAdmitted, match=why):
            adm.check(peer, token)


def test_a_token_signed_by_another_key_admits_nobody(run_key: RunKey, tmp_path: Path) -> None:
    other = RunKey.generate(tmp_path / "other.key")
    forged = other.issue(RUN, "PeerA", time.time() + 60)
    with pytest.raises(NotAdmitted, match="not signed by this run's key"):
        decode_token(forged, bytes.fromhex(run_key.public_hex))
    # a token's body altered after signing
    body, sig = msgpack.unpackb(run_key.issue(RUN, "PeerA", time.time() + 60))
    altered = msgpack.packb([msgpack.packb([RUN, "PeerB", time.time() + 60]), sig])
    with pytest.raises(NotAdmitted, match="not signed"):
        decode_token(altered, bytes.fromhex(run_key.public_hex))


def test_policies_from_config_and_one_line_errors(run_key: RunKey) -> None:
    assert admission_from(PeersConfig(run_id=RUN)).policy == "open"
    with pytest.raises(ConfigError, match="needs at least one peer ID"):
        admission_from(PeersConfig(run_id=RUN, admission="allowlist"))
    with pytest.raises(ConfigError, match="needs run_public_key"):
        admission_from(PeersConfig(run_id=RUN, admission="token"))
    with pytest.raises(ConfigError, match="64 hex"):
        admission_from(PeersConfig(run_id=RUN, admission="token", run_public_key="zz"))
    cfg = PeersConfig(run_id=RUN, admission="token", run_public_key=run_key.public_hex)
    with pytest.raises(ConfigError, match="ask the run's creator for a token for peer ID PeerA"):
        own_token(cfg, admission_from(cfg), "PeerA")
    text = encode_token_text(run_key.issue(RUN, "PeerA", time.time() + 60))
    cfg = cfg.model_copy(update={"token": text})
    assert own_token(cfg, admission_from(cfg), "PeerA") is not None
    allow = PeersConfig(run_id=RUN, admission="allowlist", allowlist=["PeerA"])
    with pytest.raises(ConfigError, match="add peer ID PeerB to the allowlist"):
        own_token(allow, admission_from(allow), "PeerB")


def _record(writer: str, value: bytes = b"\xc4\x011") -> DHTRecord:
    return DHTRecord(b"k" * 20, msgpack.packb(writer), value, 1.0e9)


def test_signed_records_round_trip_and_every_forgery_is_refused(signers: list[Signer]) -> None:
    a, b, _ = signers
    va = SignedRecords(a, Admission("open", RUN))
    rec = _record(a.peer_id)
    signed = dataclasses.replace(rec, value=va.sign_value(rec))
    assert va.validate(signed) and va.strip_value(signed) == rec.value
    vb = SignedRecords(b, Admission("open", RUN))
    assert vb.validate(signed)  # anyone checks with the writer's public key alone
    forgeries = {
        "under another peer's subkey": dataclasses.replace(signed, subkey=msgpack.packb(b.peer_id)),
        "another key": dataclasses.replace(signed, key=b"x" * 20),
        "longer life": dataclasses.replace(signed, expiration_time=2.0e9),
        "a regular value": dataclasses.replace(signed, subkey=msgpack.packb(None)),
        "junk": dataclasses.replace(signed, value=b"\x00" * 100),
        "a fake leader": _record("1"),
    }
    for what, rec2 in forgeries.items():
        assert not vb.validate(rec2), what
    # the value swapped after signing
    v, der, tok, sig = msgpack.unpackb(signed.value)
    swapped = dataclasses.replace(signed, value=msgpack.packb([b"\xc4\x012", der, tok, sig]))
    assert not vb.validate(swapped)
    # b's key claiming a's subkey: a signature that holds, by a key that is not a's
    rec_b = _record(a.peer_id)
    claimed = dataclasses.replace(rec_b, value=vb.sign_value(rec_b))
    with pytest.raises(ProtocolError, match="not the key of the claimed peer ID"):
        vb.check(claimed)


def test_records_of_peers_the_policy_keeps_out_are_refused(signers: list[Signer], run_key: RunKey) -> None:
    a, b, c = signers
    pub = bytes.fromhex(run_key.public_hex)
    policy = Admission("token", RUN, run_public=pub)
    tok_a = run_key.issue(RUN, a.peer_id, time.time() + 60)
    member = SignedRecords(a, policy, tok_a)
    rec = _record(a.peer_id)
    assert member.validate(dataclasses.replace(rec, value=member.sign_value(rec)))
    # b shows a's token; c shows none
    for signer, token in [(b, tok_a), (c, None)]:
        outsider = SignedRecords(signer, policy, token)
        r = _record(signer.peer_id)
        with pytest.raises(NotAdmitted):
            member.check(dataclasses.replace(r, value=outsider.sign_value(r)))
    allow = SignedRecords(a, Admission("allowlist", RUN, allowlist=frozenset({a.peer_id})))
    r = _record(b.peer_id)
    assert not allow.validate(dataclasses.replace(r, value=SignedRecords(b, Admission()).sign_value(r)))


def test_a_record_value_is_bounded(signers: list[Signer]) -> None:
    a = signers[0]
    v = SignedRecords(a, Admission("open", RUN))
    rec = _record(a.peer_id, msgpack.packb(b"x" * (MAX_RECORD_BYTES + 1)))
    assert not v.validate(dataclasses.replace(rec, value=v.sign_value(rec)))


def test_the_validator_travels_to_the_dht_process(signers: list[Signer]) -> None:
    import pickle

    v = SignedRecords(signers[0], Admission("open", RUN), b"tok")
    back = pickle.loads(pickle.dumps(v))
    assert back.signer.peer_id == signers[0].peer_id and back.token == b"tok"


def test_admitted_peers_decide_by_policy_and_read_the_dht_at_most_once_a_second(run_key: RunKey) -> None:
    from peers.trust.admitted import AdmittedPeers

    assert AdmittedPeers(Admission("open", RUN), list).check("anyone")
    allow = AdmittedPeers(Admission("allowlist", RUN, allowlist=frozenset({"A"})), list)
    assert allow.check("A") and not allow.check("B")
    reads: list[int] = []
    records = ["A"]

    def lookup() -> list[str]:
        reads.append(1)
        return list(records)

    policy = Admission("token", RUN, run_public=bytes.fromhex(run_key.public_hex))
    tok = AdmittedPeers(policy, lookup, min_interval=0.3)
    assert tok.decided("A") is None  # nothing read yet
    assert tok.check("A") and len(reads) == 1
    assert tok.check("A") and len(reads) == 1  # known now: no read
    time.sleep(0.35)
    asked = time.monotonic()  # a stranger's flood of streams, all queued at once: one read, not fifty
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: tok.check("X", asked), range(50)))
    assert not any(answers) and len(reads) == 2
    tok.note(["G"])  # the writer of a validated record
    assert tok.decided("G") is True


def test_an_admitted_peer_seen_just_after_a_read_waits_for_the_next_one(run_key: RunKey) -> None:
    """B's first stream arrives right after a read that did not show B's record yet: B is admitted
    at the next read (at most ``min_interval`` later), not refused (that failed whole rounds)."""
    from peers.trust.admitted import AdmittedPeers

    records = ["A"]
    reads: list[float] = []

    def lookup() -> list[str]:
        reads.append(time.monotonic())
        return list(records)

    policy = Admission("token", RUN, run_public=bytes.fromhex(run_key.public_hex))
    tok = AdmittedPeers(policy, lookup, min_interval=0.5)
    assert tok.check("A") and len(reads) == 1
    records.append("B")  # B's record lands just after that read
    t0 = time.monotonic()
    assert tok.check("B") and len(reads) == 2
    assert reads[1] - reads[0] >= 0.5 and time.monotonic() - t0 < 5
    assert not tok.check("X") and len(reads) == 3  # a stranger: refused by a read after it asked


def test_a_running_peer_whose_token_expires_stops_with_one_line(run_key: RunKey) -> None:
    """Its token expired mid-run: every other peer refuses it now, so the peer loop's periodic check
    raises one clear error (the CLI prints it, exit 1) instead of failing rounds with warnings."""
    from peers.trust.admission import AdmissionEnded, OwnAdmission

    policy = Admission("token", RUN, run_public=bytes.fromhex(run_key.public_hex))
    token = run_key.issue(RUN, "PEER", time.time() + 100)
    own = OwnAdmission(policy, token, "PEER")
    own.check()  # within its interval: nothing read
    own.check(now=time.time() + 50)  # still valid
    with pytest.raises(AdmissionEnded, match="no longer admitted.*expired.*token issue") as e:
        own.check(now=time.time() + 200)
    assert "\n" not in str(e.value)
    OwnAdmission(Admission("open", RUN), None, "PEER").check(now=time.time() + 10**9)  # open: never


def test_a_peer_knows_when_its_token_ends_and_checks_at_once_past_it(run_key: RunKey) -> None:
    """The peer loop caps every round at the token's expiry (``Deadlines.end_by``) and the first step
    after it raises: a peer waiting in a round is not left there until the round's own timeout."""
    from peers.trust.admission import AdmissionEnded, OwnAdmission

    policy = Admission("token", RUN, run_public=bytes.fromhex(run_key.public_hex))
    own = OwnAdmission(policy, run_key.issue(RUN, "PEER", time.time() + 0.5), "PEER")
    assert own.ends_at - time.monotonic() <= 0.5
    time.sleep(max(own.ends_at - time.monotonic(), 0.0) + 0.1)  # past the expiry, within the 5 s
    with pytest.raises(AdmissionEnded, match="expired"):
        own.check()
    assert own.rounds_end_by() == own.ends_at + 1.0
    assert OwnAdmission(Admission("open", RUN), None, "PEER").ends_at == float("inf")
    assert OwnAdmission(Admission("open", RUN), None, "PEER").rounds_end_by() is None
    long = OwnAdmission(policy, run_key.issue(RUN, "PEER", time.time() + 3600), "PEER")
    assert 3590 < long.ends_at - time.monotonic() <= 3600
    long.check()  # within its interval and its token: nothing to say
