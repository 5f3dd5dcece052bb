"""Commit certificates: which states a round's group signed, and the quorum a newcomer asks of them.

After a round commits, each of its members signs ``(run, round, digest, group size)`` with its
libp2p identity key (the RSA key behind its peer ID, ``peers.keys.signing``): the digest is the
shared-state digest every member of the round holds (parameters and outer momentum). A member keeps
its last :data:`MAX_CERTIFICATES` and stores them in one DHT record under ``"<run>.commit"`` (subkey:
its peer ID), beside its state announcement (``peers.state.state_transfer.StateServer``). Each
certificate verifies on its own: a reader checks that the embedded key hashes to the claimed peer ID
and that every signature holds, whatever node stored or returned the record.

A newcomer (:func:`certified`) takes the state of round ``r`` with digest ``d`` only when

* **group quorum**: more than half of the round's group signed ``(r, d)``, each signer admitted,
  each counted once; a signer that signed two different certificates for one round counts for
  neither. The group's size is the lower median of the sizes the signers of ``(r, d)`` claim, and
  at least the number of peers that signed any state of round ``r`` (:func:`group_size`): colluders
  claiming a small group cannot shrink the quorum, one claiming a huge group cannot stall it;
* **history bound**: those signers are at least half of the *established* peers: live peers that
  signed any state with a group quorum in the history the newcomer reads, and live peers whose own
  peer record says they committed rounds (``claimed``: a read that misses their certificate records
  does not drop them from the bound, so colluders cannot be half of what a partial read leaves by
  co-signing the one honest round it read). Colluders fewer than half
  of them cannot certify a round of their own ahead of the others (a group of two that signs itself
  is a quorum of its own group, not of the run's established members). Half, not more than half:
  two peers of four that commit a round while the other two are frozen or late (then preempted, they
  hand their state to those two: ``swarmtrain.app.peer.preemption``) look exactly like two colluders
  of four, and their round must be taken.

* **chain**: at least half of the live signers of the round taken before it (the certified round
  just below, by these same rules) signed it too. The established peers are read from the DHT, and
  a loaded DHT returns some members' records late or not at all: two colluders of six that never
  took part in the run's rounds can be half of what such a read leaves. Their round has none
  of the previous round's signers, whatever was read of the others' records; a group that shrinks
  by half or less (preemptions, the hand-off above) carries its round on. With no round taken
  below it (the others' records unread, so no lower round had its quorum), the round just below
  that was read at all stands in: at least half of its live signers read must have signed this
  one (one honest record read against two colluders' round ahead refuses it);
* **after a tie**: when a round between that one and this one was signed for two states and none
  won (colluders signing each round number as the honest members do, in groups as small as
  theirs), this round's live signers must be more than half of the live signers of this round
  and the tie together. Else the colluders' round ahead of a run of ties had no certified round
  before it to carry on, and it is a quorum of the group they claim.

A tie is broken by the chain: the state signed by half of the round's group, by more signers of the
round taken before it than any other state of the round and by more than half of that round's live
signers is taken as a quorum's would be (two honest members of three carry the run on; the
colluders' own state of the same round number carries none of it). Such a round is bounded by the
peers established by then (whose first quorum round is not after it): the colluders' round ahead
does not hold it back. Every other round is bounded by every established peer (a quorum round
bounded by fewer let colluders that were half of a round's signers, or that signed a round the
honest peers skipped, have their own next round taken).

So colluders fewer than half of a round's group, fewer than half of the established live peers and
fewer than half of the previous round's live signers plant nothing. What a majority can still do is
in ``docs/threat-model.md``.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgpack

from peers.keys.signing import MAX_PUBLIC_DER, Signer, verify_signed_by
from swarmtrain.core.errors import ProtocolError, SwarmError
from swarmtrain.core.safe_msgpack import unpack

__all__ = [
    "MAX_CERTIFICATES",
    "MAX_GROUP",
    "Certificate",
    "CertificatesUnread",
    "Certified",
    "certified",
    "commit_key",
    "decode_record",
    "encode_record",
    "group_size",
    "own_entries",
    "sign_certificate",
]

logger = logging.getLogger(__name__)
MAX_CERTIFICATES = 4  # certificates one member's record carries: its last committed rounds
MAX_GROUP = 1 << 16  # the largest group size a certificate may claim
_MAX_ROUND = 1 << 40  # as peers.state.donors.MAX_ROUND
_MAX_RECORD = 8 * 1024
_DOMAIN = b"swarmtrain-commit-v1\0"


class CertificatesUnread(SwarmError):
    """The run's commit certificates could not be read (a DHT read failed or timed out)."""


def commit_key(run_id: str) -> str:
    """DHT key of the run's commit certificates."""
    return f"{run_id}.commit"


@dataclass(frozen=True)
class Certificate:
    """One member's signed word that round ``round`` committed the state ``digest`` in a group of
    ``group_size`` members (verified: built only by :func:`decode_record`)."""

    signer: str
    round: int
    digest: bytes
    group_size: int


@dataclass(frozen=True)
class Certified:
    """A state that passed :func:`certified`: its round, digest, signers and the group size counted."""

    round: int
    digest: bytes
    signers: frozenset[str]
    group_size: int


def _body(run_id: str, rnd: int, digest: bytes, group_size: int) -> bytes:
    return bytes(msgpack.packb([run_id, rnd, digest, group_size], use_bin_type=True))


def _check_fields(rnd: Any, digest: Any, group_size: Any) -> None:
    if not (isinstance(rnd, int) and not isinstance(rnd, bool) and 0 <= rnd <= _MAX_ROUND):
        raise ProtocolError("commit certificate round is out of range")
    if not (isinstance(digest, bytes) and len(digest) == 32):
        raise ProtocolError("commit certificate digest is not 32 bytes")
    if not (isinstance(group_size, int) and not isinstance(group_size, bool) and 0 < group_size <= MAX_GROUP):
        raise ProtocolError("commit certificate group size is out of range")


def sign_certificate(signer: Signer, run_id: str, rnd: int, digest: bytes, group_size: int) -> list[bytes]:
    """``signer``'s certificate that round ``rnd`` of ``run_id`` committed ``digest`` in a group of
    ``group_size``: ``[body, signature]``, an entry of :func:`encode_record`."""
    _check_fields(rnd, digest, group_size)
    body = _body(run_id, rnd, digest, group_size)
    return [body, signer.sign(_DOMAIN + body)]


def encode_record(signer: Signer, entries: list[list[bytes]]) -> bytes:
    """The DHT value of ``signer``'s certificates (the last :data:`MAX_CERTIFICATES` of ``entries``):
    msgpack ``{p, k, c}`` (peer ID, public key, ``[[body, signature], ...]``)."""
    value = {"p": signer.peer_id, "k": signer.public_der, "c": entries[-MAX_CERTIFICATES:]}
    return bytes(msgpack.packb(value, use_bin_type=True))


def _record(value: Any) -> dict[str, Any]:
    """A commit record's fields, parsed within bounds and typed (nothing verified yet)."""
    if not isinstance(value, bytes) or len(value) > _MAX_RECORD:
        raise ProtocolError("commit record is not bytes or too large")
    obj = unpack(
        value,
        what="commit record",
        max_bytes=_MAX_RECORD,
        max_str=256,
        max_bin=max(MAX_PUBLIC_DER, 512),
        max_array=MAX_CERTIFICATES,
        max_map=4,
    )
    if not isinstance(obj, dict) or not (
        isinstance(obj.get("p"), str) and isinstance(obj.get("k"), bytes) and isinstance(obj.get("c"), list)
    ):
        raise ProtocolError("commit record fields missing or ill-typed")
    return obj


def decode_record(run_id: str, subkey: str, value: Any) -> list[Certificate]:
    """Verify and parse one member's record read under ``subkey``: its certificates.

    Raises:
        ProtocolError: malformed or oversized, stored under another peer's subkey, a key that is not
            ``subkey``'s, a signature that does not hold, or a certificate of another run.
    """
    return _verified(run_id, subkey, _record(value))


def _verified(run_id: str, subkey: str, obj: dict[str, Any]) -> list[Certificate]:
    """:func:`decode_record`'s checks on a record's parsed fields (:func:`_record`)."""
    if obj["p"] != subkey:
        raise ProtocolError("commit record stored under another peer's subkey")
    out = []
    for entry in obj["c"]:
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, bytes) for x in entry)):
            raise ProtocolError("commit certificate is not [body, signature]")
        body, sig = entry
        verify_signed_by(subkey, obj["k"], _DOMAIN + body, sig)
        fields = unpack(body, what="commit certificate", max_bytes=256, max_str=128, max_bin=32, max_array=4)
        if not (isinstance(fields, list) and len(fields) == 4):
            raise ProtocolError("commit certificate is not [run, round, digest, group size]")
        run, rnd, digest, size = fields
        if run != run_id:
            raise ProtocolError("commit certificate of another run")
        _check_fields(rnd, digest, size)
        out.append(Certificate(subkey, rnd, digest, size))
    return out


def own_entries(node: Any, run_id: str, timeout: float) -> list[tuple[int, list[bytes]]]:
    """The certificates this peer's identity stored before (an earlier process of the same volunteer),
    as ``(round, [body, signature])`` (entries of :func:`encode_record`), oldest first; ``[]`` when
    there are none or they could not be read. A restarted peer keeps them in its next record: else its first
    store replaces its earlier process's history with one certificate, and a reader that does not
    yet hold the others' certificate of that round does not count it as established (the seat rule,
    ``peers.rounds.seats``), while the members that knew it still do."""
    from peers.dht.node import dht_time

    try:
        found = node.dht.get(commit_key(run_id), latest=True, return_future=True).result(timeout)
        item = found.value.get(node.peer_id) if found is not None and isinstance(found.value, dict) else None
        if item is None or item.expiration_time < dht_time():
            return []
        obj = _record(item.value)
        certs = _verified(run_id, node.peer_id, obj)  # every entry, in the record's order
        entries = obj["c"]
    except Exception as e:
        logger.info("reading this peer's earlier commit certificates failed: %s", e)
        return []
    return sorted(((c.round, list(e)) for c, e in zip(certs, entries, strict=True)), key=lambda ce: ce[0])


def group_size(claims: list[int], signers: int) -> int:
    """The group size a state's quorum is counted against: the lower median of the sizes its signers
    claim (one signer claiming a huge group cannot stall the round; while honest signers are most of
    them, the median is theirs), and at least the number of distinct peers that signed any state of
    the round (each of them claims to be a member: colluders claiming a group of two for a state of
    their own cannot shrink the round)."""
    ordered = sorted(claims)
    return max(ordered[(len(ordered) - 1) // 2], signers)


def certified(
    certs: Iterable[Certificate],
    *,
    admitted: Callable[[str], bool] | None = None,
    live: frozenset[str] | None = None,
    claimed: frozenset[str] = frozenset(),
    errors: list[str] | None = None,
) -> dict[int, Certified]:
    """The certified state of each round (at most one a round), by the rules in the module docstring.

    Args:
        certs: verified certificates (:func:`decode_record`), any number per signer.
        admitted: whether a signer is admitted (``None``: everyone); others' certificates count for
            nothing.
        live: the peers with a live record (``None``: unknown, every established signer counts).
        claimed: live peers whose own record says they committed rounds: established peers too,
            whether or not their certificates were read (a partial read cannot shrink the bound).
        errors: why a round was refused, appended.
    """
    errs = errors if errors is not None else []
    by_round = _by_round(certs, admitted)
    quorum: dict[int, Certified] = {}
    contested: dict[int, frozenset[str]] = {}  # rounds signed for two states that none won: their signers
    halves: dict[int, list[Certified]] = {}  # those rounds' states, each with its signers and group
    for rnd, signed in by_round.items():
        honest = {p: next(iter(v)) for p, v in signed.items() if len(v) == 1}  # equivocators drop out
        if len({d for v in signed.values() for d, _ in v}) > 1:
            contested[rnd] = frozenset(signed)  # dropped below if one state wins
        if len(honest) < len(signed):
            errs.append(f"round {rnd}: {len(signed) - len(honest)} signers signed two states")
        if not honest:
            continue
        claims: dict[bytes, list[int]] = defaultdict(list)
        for d, n in honest.values():
            claims[d].append(n)
        winners = []
        for d, sizes in claims.items():
            size = group_size(sizes, len(signed))
            if 2 * len(sizes) > size:
                winners.append((d, size))
        # two states cannot both have one: each quorum is over half of the round's signers
        if not winners:
            d, sizes = max(claims.items(), key=lambda kv: len(kv[1]))
            errs.append(f"round {rnd}: {len(sizes)} of a group of {group_size(sizes, len(signed))} signed")
            if rnd in contested:
                halves[rnd] = [
                    Certified(rnd, d, _signers(honest, d), group_size(n, len(signed)))
                    for d, n in claims.items()
                ]
            continue
        digest, size = winners[0]
        quorum[rnd] = Certified(rnd, digest, _signers(honest, digest), size)
        contested.pop(rnd, None)
    signed_by = {rnd: frozenset(signed) for rnd, signed in by_round.items()}
    return _bounded(quorum, contested, halves, live, errs, claimed=claimed, signed_by=signed_by)


def _signers(honest: dict[str, tuple[bytes, int]], digest: bytes) -> frozenset[str]:
    """The signers of ``digest`` among a round's ``honest`` ones (signer -> its one claim)."""
    return frozenset(p for p, (d, _) in honest.items() if d == digest)


def _by_round(
    certs: Iterable[Certificate], admitted: Callable[[str], bool] | None
) -> dict[int, dict[str, set[tuple[bytes, int]]]]:
    """The admitted signers' ``(digest, group size)`` claims, by round and signer."""
    by_round: dict[int, dict[str, set[tuple[bytes, int]]]] = defaultdict(lambda: defaultdict(set))
    verdict: dict[str, bool] = {}
    for c in certs:
        if c.signer not in verdict:
            verdict[c.signer] = admitted is None or admitted(c.signer)
        if verdict[c.signer]:
            by_round[c.round][c.signer].add((c.digest, c.group_size))
    return by_round


def _bounded(
    quorum: dict[int, Certified],
    contested: dict[int, frozenset[str]],
    halves: dict[int, list[Certified]],
    live: frozenset[str] | None,
    errs: list[str],
    *,
    claimed: frozenset[str],
    signed_by: dict[int, frozenset[str]],
) -> dict[int, Certified]:
    """The rounds of ``quorum`` that pass the history bound and the chain (the module docstring);
    ``contested``: the signers of each round signed for two states of which none won; ``halves``:
    those rounds' states (a tie the chain breaks is taken as a quorum would be); ``claimed``: live
    peers established by their own record's claim; ``signed_by``: every admitted signer read of
    each round, whatever it signed (for the chain over a round that is not taken)."""
    first: dict[str, int] = {}  # each established peer's first quorum round
    for rnd in sorted(quorum):
        for p in quorum[rnd].signers:
            first.setdefault(p, rnd)
    if live is not None:
        first = {p: r for p, r in first.items() if p in live}

    def alive(peers: frozenset[str]) -> frozenset[str]:
        return peers if live is None else peers & live

    out: dict[int, Certified] = {}
    prev: Certified | None = None  # the round before, as taken
    for rnd in sorted(quorum.keys() | halves.keys()):
        if rnd in quorum:
            q = quorum[rnd]
        else:
            broken = _tie_broken(halves[rnd], prev, alive)
            if broken is None:
                continue  # a tie: the rounds after it face the rule after a tie
            q = broken
        tie = max((r for r in contested if r < rnd and (prev is None or r > prev.round)), default=None)
        # a tie the chain broke is bounded by the peers established by then: signers whose first
        # round is after it (the colluders' round ahead) do not hold it back
        chained = prev is not None and tie is None and rnd not in quorum
        established = {p for p, r in first.items() if not chained or r <= rnd}
        if not chained:
            established |= claimed
        if 2 * len(q.signers) < len(established):
            errs.append(f"round {rnd}: {len(q.signers)} of the {len(established)} established peers signed")
            continue
        why = _unchained(rnd, q, prev, tie, contested, signed_by, alive)
        if why:
            errs.append(why)
            continue
        out[rnd] = q
        prev = q
    return out


def _unchained(
    rnd: int,
    q: Certified,
    prev: Certified | None,
    tie: int | None,
    contested: dict[int, frozenset[str]],
    signed_by: dict[int, frozenset[str]],
    alive: Callable[[frozenset[str]], frozenset[str]],
) -> str:
    """Why round ``rnd``'s state ``q`` does not carry the run's history on (``""``: it does): after a
    tie, its live signers must outnumber the others of both; else at least half of the live signers
    of the round taken before it (``prev``) must have signed it; with no round taken before it, at
    least half of the live signers read of the round just below that was read at all."""
    if tie is not None:
        # the round before is a tie: this round's signers must outnumber the others of both
        voters = alive(contested[tie] | q.signers)
        if 2 * len(alive(q.signers)) <= len(voters):
            return (
                f"round {rnd}: {len(alive(q.signers))} of the {len(voters)} live signers of it "
                f"and of round {tie} (a tie) signed"
            )
        if prev is not None:
            return ""
    if prev is not None:
        base, label = prev.signers, f"live signers of round {prev.round}"
    else:
        # no round below was taken (the others' records unread), but the round just below was read:
        # its live signers carry the run, and a round none of them signed does not (with a round
        # taken before, the chain holds; colluders co-signing a round are bounded by the established
        # peers' own claims)
        below = max((r for r in signed_by if r < rnd), default=None)
        if below is None or below in contested:
            return ""
        base, label = signed_by[below], f"live signers read of round {below} (not taken)"
    before = alive(base)
    carried = len(q.signers & base)
    if 2 * carried < len(before):
        return f"round {rnd}: {carried} of the {len(before)} {label} signed"
    return ""


def _tie_broken(
    states: list[Certified], prev: Certified | None, alive: Callable[[frozenset[str]], frozenset[str]]
) -> Certified | None:
    """The state of a tied round that the chain breaks the tie for: signed by half of its group, by
    more signers of the round taken before it than any other state of the round, and by more than
    half of that round's live signers (the honest members carry the run's history on; colluders that
    signed their own state of each round number carry none of it); ``None``: it stays a tie."""
    if prev is None:
        return None
    carried = sorted(((len(q.signers & prev.signers), q) for q in states), key=lambda cq: -cq[0])
    best, q = carried[0]
    runner_up = carried[1][0] if len(carried) > 1 else 0
    if 2 * len(q.signers) < q.group_size or best <= runner_up or 2 * best <= len(alive(prev.signers)):
        return None
    return q


def read_certificates(node: Any, run_id: str, timeout: float, *, strict: bool = False) -> list[Certificate]:
    """The run's certificates whose signatures verify; a bad record is skipped (logged).

    Raises:
        CertificatesUnread: ``strict`` and the read failed or timed out (else: logged, ``[]``), so
            that a caller can tell "no certificates" from "could not read them".
    """
    from peers.dht.node import dht_time

    try:
        found = node.dht.get(commit_key(run_id), latest=True, return_future=True).result(timeout)
    except Exception as e:
        logger.info("reading commit certificates failed: %s", e)
        if strict:
            raise CertificatesUnread(f"reading the commit certificates failed: {type(e).__name__}") from e
        return []
    if found is None or not isinstance(found.value, dict):
        return []
    now = dht_time()
    out: list[Certificate] = []
    for subkey, item in found.value.items():
        if not isinstance(subkey, str) or item.expiration_time < now:
            continue
        try:
            out.extend(decode_record(run_id, subkey, item.value))
        except ProtocolError as e:
            logger.warning("ignoring a commit record under %s: %s", subkey[:16], e)
    return out
