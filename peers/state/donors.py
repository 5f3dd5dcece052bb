"""Which donor's state a newcomer takes: the state announcements in the DHT, read and bounded, then
the rounds the other peers bear out (witnesses) and the states enough donors vouch for.

A donor (``peers.state.state_transfer.StateServer``) announces ``{hash, nbytes, round, vouch,
manifest}`` under ``"<run_id>.state"``: its snapshot's SHA-256, size and round, the ``(round, digest)``
of the last few states it committed itself (the digest of the parameters every peer must agree on),
and the hash of the snapshot's chunk manifest (``peers.state.state_chunks``). A newcomer reads them
all (:func:`announcements`), leaves out a donor whose round no other peer bears out (:func:`witnessed`)
and, with ``vouchers = k``, one whose state fewer than ``min(k, donors)`` distinct donors vouch for
(:func:`vouched`): one admitted donor alone cannot plant a state. Once the run has commit
certificates (``peers.state.certificates``: each member of a committed round signs its round, digest
and group size), the vouches give way to them (:func:`certified_states`): a state is taken only when
more than half of its round's group, each admitted, signed its digest, and those signers are at least
half of the established live peers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from peers.dht.node import PeerNode
from peers.state.certificates import CertificatesUnread, Certified, certified, read_certificates
from swarmtrain.core.errors import ProtocolError, SwarmError
from swarmtrain.core.safe_msgpack import unpack

__all__ = [
    "MAX_VOUCHES",
    "ROUND_SLACK",
    "Announcement",
    "Vouches",
    "announcements",
    "by_certificate",
    "candidates",
    "certified_states",
    "decode_announcement",
    "encode_announcement",
    "freshest_vouched",
    "parse_announcement",
    "state_key",
    "vouched",
    "vouched_by",
    "witnessed",
    "MAX_ROUND",
]

logger = logging.getLogger(__name__)
_MAX_ANNOUNCEMENT = 1024  # bytes of one donor's DHT announcement
#: the largest round number a state or an announcement may name (a round a second for 34,000 years):
#: a donor's round 2^62 would be picked first and push the newcomer's round counter out of range
MAX_ROUND = 1 << 40
MAX_VOUCHES = 4  # (round, digest) pairs one announcement vouches for: its recent committed states
#: one donor's announcement as a newcomer weighs it: ``(round, peer_id, state hash, nbytes)``
Announcement = tuple[int, str, bytes, int]


def state_key(run_id: str) -> str:
    """DHT key of the state announcements of ``run_id``."""
    return f"{run_id}.state"


def encode_announcement(
    digest: bytes,
    nbytes: int,
    rnd: int,
    vouches: list[tuple[int, bytes]],
    manifest: bytes,
    *,
    leaving: bool,
    certifies: bool = False,
) -> bytes:
    """A donor's announcement of its snapshot (read back by :func:`parse_announcement`); ``leaving``:
    the donor is about to leave (it still serves its state); ``certifies``: it stored commit
    certificates of its rounds (``peers.state.certificates``), so the run has them."""
    item: dict[str, Any] = {
        "hash": digest,
        "nbytes": nbytes,
        "round": rnd,
        "vouch": [[r, d] for r, d in vouches],
    }
    item["manifest"] = manifest
    if leaving:
        item["leaving"] = True
    if certifies:
        item["certifies"] = True
    return bytes(msgpack.packb(item, use_bin_type=True))


def decode_announcement(value: Any) -> tuple[bytes, int, int]:
    """Parse a donor's DHT announcement ``{hash, nbytes, round, vouch}``: ``(sha256, nbytes, round)``.

    Raises:
        ProtocolError: not bytes, over 1 KiB, not bounded msgpack, or fields missing or ill-typed.
    """
    h, n, r = parse_announcement(value)[:3]
    return h, n, r


Vouches = frozenset[tuple[int, bytes]]


def parse_announcement(value: Any) -> tuple[bytes, int, int, Vouches, bytes | None, bool]:
    """:func:`decode_announcement` plus the ``(round, digest)`` pairs the donor vouches for (at most
    :data:`MAX_VOUCHES`; an announcement without them vouches for nothing), the hash of the state's
    chunk manifest (``peers.state.state_chunks``; ``None``: an older donor, whose state cannot be
    pulled) and whether the donor says it stored commit certificates.

    Raises:
        ProtocolError: as :func:`decode_announcement`, or a malformed ``vouch`` list.
    """
    if not isinstance(value, bytes) or len(value) > _MAX_ANNOUNCEMENT:
        raise ProtocolError("state announcement is not bytes or too large")
    obj = unpack(
        value,
        what="state announcement",
        max_bytes=_MAX_ANNOUNCEMENT,
        max_str=64,
        max_bin=64,
        max_array=_MAX_ANNOUNCEMENT,  # the vouch list is checked below; the length bounds any array
        max_map=8,
    )
    if not isinstance(obj, dict):
        raise ProtocolError("state announcement is not a map")
    h, n, r = obj.get("hash"), obj.get("nbytes"), obj.get("round")
    if not (isinstance(h, bytes) and len(h) == 32 and isinstance(n, int) and isinstance(r, int) and n > 0):
        raise ProtocolError("state announcement fields missing or ill-typed")
    if not 0 <= r <= MAX_ROUND:
        raise ProtocolError(f"state announcement round {r} is out of range")
    raw = obj.get("vouch", [])
    if not isinstance(raw, list) or len(raw) > MAX_VOUCHES:
        raise ProtocolError(f"state announcement vouches for more than {MAX_VOUCHES} states")
    vouches = set()
    for v in raw:
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and 0 <= v[0] <= MAX_ROUND):
            raise ProtocolError("state announcement vouch is not [round, digest]")
        if not (isinstance(v[1], bytes) and len(v[1]) == 32):
            raise ProtocolError("state announcement vouch digest is not 32 bytes")
        vouches.add((v[0], v[1]))
    m = obj.get("manifest")
    if m is not None and not (isinstance(m, bytes) and len(m) == 32):
        raise ProtocolError("state announcement manifest hash is not 32 bytes")
    return h, n, r, frozenset(vouches), m, obj.get("certifies") is True


def announcements(
    node: PeerNode,
    run_id: str,
    timeout: float,
    vouches: dict[str, Vouches] | None = None,
    manifests: dict[str, bytes] | None = None,
    certifying: set[str] | None = None,
) -> list[Announcement]:
    """Valid announcements ``(round, peer_id, hash, nbytes)``, best (highest round) first; each
    donor's vouches and manifest hash go into ``vouches`` and ``manifests`` (by peer ID) when given,
    and the donors that say they stored commit certificates into ``certifying``."""
    try:
        found = node.dht.get(state_key(run_id), latest=True, return_future=True).result(timeout)
    except TimeoutError:
        return []
    if found is None or not isinstance(found.value, dict):
        return []
    out = []
    for peer, item in found.value.items():
        if peer == node.peer_id:
            continue
        try:
            h, n, r, v, m, c = parse_announcement(item.value)
        except ProtocolError:
            continue  # one bad announcement is skipped, the others still count
        out.append((r, str(peer), h, n))
        if certifying is not None and c:
            certifying.add(str(peer))
        if manifests is not None and m is not None:
            manifests[str(peer)] = m
        if vouches is not None:
            vouches[str(peer)] = v
    return sorted(out, key=lambda a: (-a[0], a[1]))


#: rounds a donor's announcement may be ahead of the most advanced other peer (records are published
#: after a round, announcements right after its commit)
ROUND_SLACK = 2


def witnessed(node: PeerNode, run: str, found: list[Announcement], errors: list[str]) -> list[Announcement]:
    """The announcements whose round the *other* peers bear out: at most :data:`ROUND_SLACK` past the
    highest round any other peer (not the announcer, not this one) announced or published in its
    record. A donor alone cannot claim round 10^12 to be picked first. Other donors' announcements
    count as well as records: records lag (a peer re-publishes its record after a round, and a loaded
    DHT stores it a few rounds late when rounds take a second), announcements do not, so honest donors
    bear each other out. Peers at round 0 (newcomers) are no witnesses; with none, every announcement
    stands."""
    if not found:
        return found
    try:
        records = [(r.peer_id, r.round) for r in node.live_peers(run, timeout=15.0)]
    except SwarmError:
        return found
    rounds = [(p, r) for p, r in records + [(a[1], a[0]) for a in found] if r > 0 and p != node.peer_id]
    out = []
    for a in found:
        seen = [r for p, r in rounds if p != a[1]]
        if seen and a[0] > max(seen) + ROUND_SLACK:
            errors.append(f"{a[1][:12]}: announced round {a[0]}, the others are at {max(seen)}")
            continue
        out.append(a)
    return out


def vouched(
    found: list[Announcement], vouches: Mapping[str, Vouches], k: int, errors: list[str]
) -> list[tuple[Announcement, bytes | None]]:
    """The announcements whose state enough independent donors vouch for, each with the digest they
    vouch for: a donor's state of round ``r`` counts when at least ``min(k, donors)`` distinct donors
    (itself included) vouch for the same ``(r, digest)`` that it vouches for; ``donors`` is how many
    distinct donors announced. With one donor (or ``k <= 1``) every announcement stands, with the
    digest it vouches for if any. A lone admitted donor cannot make a newcomer adopt a state the
    others did not commit. When the donors that vouch for round ``r`` disagree on its digest, a state
    counts only with a strict majority of them (colluders fewer than the honest donors
    of a round plant nothing in it; a round only they vouch for is bounded by :func:`witnessed`)."""
    donors = {a[1] for a in found}
    need = min(k, len(donors))
    out: list[tuple[Announcement, bytes | None]] = []
    for a in found:
        own = [d for r, d in vouches.get(a[1], frozenset()) if r == a[0]]
        if need <= 1:
            out.append((a, own[0] if len(own) == 1 else None))
            continue
        if len(own) != 1:
            errors.append(f"{a[1][:12]}: its state of round {a[0]} is not one it committed")
            continue
        support = sum(1 for p in donors if (a[0], own[0]) in vouches.get(p, frozenset()))
        if support < need:
            errors.append(f"{a[1][:12]}: round {a[0]} vouched for by {support} of the {need} donors needed")
            continue
        at_round = sum(1 for p in donors if any(r == a[0] for r, _ in vouches.get(p, frozenset())))
        if 2 * support <= at_round:  # donors disagree on the round's state: only a strict majority wins
            errors.append(f"{a[1][:12]}: round {a[0]} vouched for by {support} of {at_round} donors at it")
            continue
        out.append((a, own[0]))
    return out


def candidates(
    node: PeerNode,
    run: str,
    exclude: frozenset[str],
    vouchers: int,
    errors: list[str],
    manifests: dict[str, bytes] | None = None,
) -> list[tuple[Announcement, bytes | None]]:
    """The announcements a newcomer may take, best (highest round) first, each with the digest the
    donors vouch for: read once, bounded and parsed, then witnessed and vouched for."""
    vouches: dict[str, Vouches] = {}
    admitted = getattr(node, "admitted", None)
    if admitted is not None and run == node.run_id:  # revoked or expired donors neither serve nor vouch
        admitted.read_revocations()
        exclude = exclude | admitted.refused()
    certifying: set[str] = set()
    found = [a for a in announcements(node, run, 15.0, vouches, manifests, certifying) if a[1] not in exclude]
    found = witnessed(node, run, found, errors)
    states = certified_states(node, run, exclude, errors, found, frozenset(certifying))
    if states is not None:  # the run has commit certificates: only a certified state is taken
        return by_certificate(found, states, errors)
    return vouched(found, vouches, vouchers, errors)


def certified_states(
    node: PeerNode,
    run: str,
    exclude: frozenset[str],
    errors: list[str],
    found: Sequence[Announcement] = (),
    certifying: frozenset[str] = frozenset(),
) -> dict[int, Certified] | None:
    """The run's certified states by round (``peers.state.certificates.certified``: a quorum of each
    round's group, admitted signers, bounded by the established live peers); ``None`` when the run
    has no valid certificate yet (no round committed: the vouching rules alone apply then).

    ``found``, ``certifying``: the announcements just read and the donors among them that say they
    stored commit certificates. While one of them says so, no certificate read means a read that
    came back empty (a loaded DHT answers "nothing found" as readily as it times out), not a run
    without certificates: nothing is certified this time; nor when the records of half of them or
    more are missing from the read (a partial read: what is left may be the colluders' records;
    fewer than half of the donors that say so and store nothing cannot stall newcomers). The
    donors that announced are live peers too, beside those whose peer record was read: a live read
    that missed some of them would shrink the history bound."""
    # Every signer is admitted: its commit record is a signed DHT record, whose writer's join token
    # (expiry included) the record validator checks when another node stores it and when another
    # node returns it (``peers.dht.dht_records``), and ``exclude`` holds the peers this node refuses
    # (revoked, expired). A signer's own peer record is not needed: one that left since it signed
    # still counts (under ``token`` its record's token is checked instead).
    try:
        read = read_certificates(node, run, 15.0, strict=True)
    except CertificatesUnread as e:
        # fail closed: a read that failed is not a run without certificates (whose weaker vouching
        # rules colluders pass); nothing is certified this time, the newcomer looks again
        return _unread(str(e), errors)
    certs = [c for c in read if c.signer not in exclude]
    said = certifying & {a[1] for a in found}
    if not certs:
        if said:
            return _unread(f"{len(said)} donors stored commit certificates, none was read", errors)
        logger.debug("no commit certificate read: the vouching rules apply")
        return None
    unread = said - {c.signer for c in certs}
    if said and 2 * len(unread) >= len(said):  # half of them: a partial read, not a few donors that lie
        return _unread(
            f"{len(unread)} of the {len(said)} donors that stored commit certificates unread", errors
        )
    live, claimed = _live(node, run, found, exclude)
    states = certified(certs, live=live, claimed=claimed, errors=errors)
    logger.debug(
        "certified rounds %s (signers, group); %s live peers, %d say they committed; announced %s",
        {r: (len(c.signers), c.group_size) for r, c in sorted(states.items())[-3:]},
        "unknown" if live is None else len(live),
        len(claimed),
        [(a[0], a[1][-6:]) for a in found[:6]],
    )
    return states


def _live(
    node: PeerNode, run: str, found: Sequence[Announcement], exclude: frozenset[str]
) -> tuple[frozenset[str] | None, frozenset[str]]:
    """The run's live peers (``None``: unknown) and those of them whose own record says they
    committed rounds: established, whether or not their certificates were read (a read that misses
    honest records cannot leave colluders half the bound)."""
    try:
        peers = node.live_peers(run, timeout=15.0)
    except SwarmError:
        peers = []
    # the reader itself is not counted: it asks for the rounds it missed, and counted among the
    # established peers by its own earlier certificates it would make every round it missed harder
    # to take (a restarted peer: its old record is still read)
    others = [r for r in peers if r.peer_id != node.peer_id]
    records = frozenset(r.peer_id for r in others)
    claimed = frozenset(r.peer_id for r in others if r.committed_rounds > 0) - exclude
    # an empty read says nothing of who is live (None: every established signer counts)
    return ((records | {a[1] for a in found}) - {node.peer_id} if records else None), claimed


def _unread(why: str, errors: list[str]) -> dict[int, Certified]:
    """Nothing certified this time (logged, appended to ``errors``): the newcomer looks again."""
    errors.append(why)
    logger.warning("%s: no state taken this time", why)
    return {}


def by_certificate(
    found: list[Announcement], states: Mapping[int, Certified], errors: list[str]
) -> list[tuple[Announcement, bytes | None]]:
    """The announcements of a certified round, each with the certified digest (the caller checks the
    downloaded state has it)."""
    out: list[tuple[Announcement, bytes | None]] = []
    for a in found:
        if a[0] in states:
            out.append((a, states[a[0]].digest))
        else:
            errors.append(f"{a[1][:12]}: round {a[0]} has no certified state")
    return out


def freshest_vouched(
    node: PeerNode,
    *,
    run_id: str | None = None,
    wait_for_donor: float = 0.0,
    exclude: frozenset[str] = frozenset(),
    vouchers: int = 1,
) -> tuple[int, bytes] | None:
    """The ``(round, shared-parameter digest)`` of the freshest state the run's donors vouch for, by
    the rules ``peers.state.state_transfer.download_state`` takes a state by (witnessed round,
    ``vouchers``); ``None`` when no donor announced one within ``wait_for_donor`` seconds or the
    freshest carries no vouch. A peer
    that holds this very state (its own, saved when it committed that round) needs no download."""
    run = run_id or node.run_id
    deadline = time.monotonic() + wait_for_donor
    while True:
        chosen = candidates(node, run, exclude, vouchers, [])
        if chosen:
            (rnd, _, _, _), shared = chosen[0]
            return None if shared is None else (rnd, shared)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def vouched_by(chosen: list[tuple[Announcement, bytes | None]], rnd: int, shared: bytes | None) -> int:
    """How many distinct donors of ``chosen`` vouch for round ``rnd`` with digest ``shared`` (0: none)."""
    return len({a[1] for a, v in chosen if a[0] == rnd and v == shared}) if shared is not None else 0
