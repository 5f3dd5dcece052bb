"""Round formation from DHT records: who takes part in round ``r`` of a run, fixed by one leader.

Scheme (one DHT key pair per round and kind):

1. *Join.* Each peer stores ``"<run>.<kind>.<r>.join"[peer_id]`` with an expiration past its deadline.
2. *Close.* The peer with the smallest ID among the joiners it sees is the leader. It closes the round
   as soon as ``expected_peers`` have joined, or ``join_window`` seconds after its own arrival with at
   least ``min_peers``, and publishes the sorted member list under ``"<run>.<kind>.<r>.group"[leader]``.
3. *Adopt.* Every peer polls the group key; among valid published lists it adopts the one with the
   smallest leader ID. If that list does not contain it, it is *late*: the round goes on without it
   and its call returns ``committed=False`` at once instead of blocking anyone.
4. *Push* (a shortcut, not a second source of truth): right after publishing, the leader also sends
   the same list straight to every member (``P2PCollective``: a ``grp`` message, authenticated by the
   libp2p peer ID of its sender). A member waiting for the round treats a pushed list exactly like a
   published record of its sender (``_adopt``: the sender must be the list's smallest member, not
   banned, the member must be on it), so it starts without waiting for its next DHT poll.

Consistency: the member list is never inferred locally from a partial view, it is always one leader's
published list, and every data message of the round carries the group digest (a hash of run, kind,
round and members). If two leaders ever published competing lists (they could not see each other),
a peer holding the other list's digest refuses the messages, so the round fails (``committed=False``)
rather than mixing members: no peer commits with a membership another member disagrees with.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgpack

from swarmtrain.errors import PeerTimeoutError, ProtocolError, SwarmError

__all__ = ["Group", "RoundFailed", "ListsBannedPeer", "Matchmaker", "group_digest"]

logger = logging.getLogger(__name__)
_MAX_MEMBERS = 1024
_GROUP_TTL = 600.0


class RoundFailed(SwarmError):
    """The round could not be formed or finished; ``reason`` says why (returned in ``RoundResult``)."""


class ListsBannedPeer(RoundFailed):
    """The round's published list holds a peer this peer considers banned; ``group`` is that list
    (so the caller can tell its members to abort rather than wait for it)."""

    def __init__(self, message: str, group: Group) -> None:
        super().__init__(message)
        self.group = group


@dataclass(frozen=True)
class Group:
    """The fixed membership of one round.

    Attributes:
        kind: the collective kind (``"reduce"``, ``"gather"``...).
        round_id: the round number.
        members: sorted peer IDs; partition ``i`` belongs to ``members[i]``.
        leader: the peer that fixed the list (``min(members)``).
        digest: 16-byte hash of (run, kind, round, members); every message of the round carries it.
        index: this peer's position in ``members``.
    """

    kind: str
    round_id: int
    members: tuple[str, ...]
    leader: str
    digest: bytes
    index: int

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self.members)


def group_digest(run_id: str, kind: str, round_id: int, members: tuple[str, ...]) -> bytes:
    """The 16-byte digest that binds a message to one round and one member list."""
    h = hashlib.sha256(f"{run_id}|{kind}|{round_id}|".encode())
    h.update(",".join(members).encode())
    return h.digest()[:16]


def _decode_members(value: object) -> tuple[str, ...]:
    if not isinstance(value, bytes) or len(value) > 128 * _MAX_MEMBERS:
        raise ProtocolError("group record is not bytes or too large")
    try:
        obj = msgpack.unpackb(value, raw=False, max_array_len=_MAX_MEMBERS, max_str_len=128, max_bin_len=0)
    except Exception as e:
        raise ProtocolError(f"malformed group record: {type(e).__name__}") from None
    if not isinstance(obj, list) or not obj or not all(isinstance(m, str) and m for m in obj):
        raise ProtocolError("group record is not a non-empty list of peer IDs")
    members = tuple(obj)
    if list(members) != sorted(set(members)):
        raise ProtocolError("group record members are not sorted and unique")
    return members


class Matchmaker:
    """Forms the groups of one run from DHT records (see the module docstring for the scheme).

    Args:
        dht: a started ``hivemind.DHT``.
        peer_id: this peer's ID.
        run_id: the run ID (DHT key prefix).
        min_peers: a leader does not close a round with fewer joiners.
        expected_peers: close as soon as this many joined (``None``: wait the whole join window).
        join_window: seconds a leader waits for joiners after its own arrival.
        poll: seconds between DHT polls.
    """

    def __init__(
        self,
        dht: object,
        peer_id: str,
        run_id: str,
        *,
        min_peers: int = 1,
        expected_peers: int | None = None,
        join_window: float = 3.0,
        poll: float = 0.05,
    ) -> None:
        self.dht = dht
        self.peer_id = peer_id
        self.run_id = run_id
        self.min_peers = min_peers
        self.expected_peers = expected_peers
        self.join_window = join_window
        self.poll = poll
        #: peers excluded from rounds (issue 6 bans, kept up to date by ``peers.guard``): a leader leaves
        #: them out of its list and a member refuses a published list that holds one
        self.banned: frozenset[str] = frozenset()
        #: optional direct delivery of group lists (step 4): ``inbox(kind, round, wait_s)`` waits up to
        #: ``wait_s`` seconds and returns ``{sender: record bytes}`` of the lists pushed so far;
        #: ``push(kind, round, members, value)`` sends a list to the members; both set by the collective
        self.inbox: Callable[[str, int, float], dict[str, object]] | None = None
        self.push: Callable[[str, int, tuple[str, ...], bytes], None] | None = None

    def _key(self, kind: str, round_id: int, what: str) -> str:
        return f"{self.run_id}.{kind}.{round_id}.{what}"

    def _get(self, key: str, timeout: float) -> dict[str, object]:
        from peers.node import dht_time

        try:
            found = self.dht.get(key, latest=True, return_future=True).result(max(timeout, 0.5))  # type: ignore[attr-defined]
        except TimeoutError:
            return {}
        if found is None or not isinstance(found.value, dict):
            return {}
        now = dht_time()
        return {k: v.value for k, v in found.value.items() if isinstance(k, str) and v.expiration_time >= now}

    def _store(self, key: str, subkey: str, value: bytes, expiration: float, timeout: float) -> None:
        fut = self.dht.store(key, value, expiration, subkey=subkey, return_future=True)  # type: ignore[attr-defined]
        try:
            fut.result(max(timeout, 0.5))
        except TimeoutError:
            logger.warning("DHT store of %s timed out", key)

    def _adopt(self, kind: str, round_id: int, records: dict[str, object]) -> Group | None:
        """The valid published list with the smallest leader ID, if any."""
        for leader in sorted(records):
            try:
                members = _decode_members(records[leader])
            except ProtocolError as e:
                logger.warning("ignoring a bad group record from %s: %s", leader[:16], e)
                continue
            if members[0] != leader:
                logger.warning("ignoring group record of %s: leader is not its smallest member", leader[:16])
                continue
            if leader in self.banned - {self.peer_id}:  # a banned leader cannot capture the round
                logger.info("ignoring group record of banned %s", leader[:16])
                continue
            if self.peer_id not in members:
                raise RoundFailed(f"late: round {round_id} was formed without this peer")
            group = Group(
                kind=kind,
                round_id=round_id,
                members=members,
                leader=leader,
                digest=group_digest(self.run_id, kind, round_id, members),
                index=members.index(self.peer_id),
            )
            bad = sorted(set(members) & (self.banned - {self.peer_id}))
            if bad:
                raise ListsBannedPeer(f"round {round_id} lists banned peers {[b[:12] for b in bad]}", group)
            return group
        return None

    def form_group(self, kind: str, round_id: int, deadline: float) -> Group:
        """Join round ``round_id`` of ``kind`` and return its fixed membership.

        Args:
            deadline: ``time.monotonic()`` by which the group must be known.

        Raises:
            RoundFailed: late (the round formed without us) or no group by the deadline.
        """
        from peers.node import dht_time

        join_key = self._key(kind, round_id, "join")
        group_key = self._key(kind, round_id, "group")
        arrived = time.monotonic()
        close_at = arrived + self.join_window
        ttl = max(deadline - arrived, 0.0) + 60.0
        self._store(join_key, self.peer_id, b"1", dht_time() + ttl, deadline - time.monotonic())
        # With pushed lists (step 4) each poll needs one DHT read, not two: a peer that may still lead
        # reads the joins (a smaller leader's list reaches it by push, and its own publish re-reads the
        # group key anyway); a peer that saw a smaller joiner never leads this round (join records only
        # accumulate) and reads the group key, the fallback for a lost push.
        may_lead = True
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RoundFailed(f"no group for round {round_id} before the deadline")
            if self.inbox is not None:
                group = self._adopt(kind, round_id, self.inbox(kind, round_id, 0.0))
                if group is not None:
                    return group
            if not may_lead or self.inbox is None:
                group = self._adopt(kind, round_id, self._get(group_key, left))
                if group is not None:
                    return group
            if not may_lead:  # wait for the leader's list: pushed, or read from the DHT next poll
                if self.inbox is None:
                    time.sleep(self.poll)
                    continue
                group = self._adopt(kind, round_id, self.inbox(kind, round_id, self.poll))
                if group is not None:
                    return group
                continue
            joined = sorted(set(self._get(join_key, left)) - (self.banned - {self.peer_id}))
            if self.peer_id not in joined:
                joined = sorted({*joined, self.peer_id})
            may_lead = joined[0] == self.peer_id
            enough = len(joined) >= self.min_peers
            expected = None if self.expected_peers is None else self.expected_peers - len(self.banned)
            full = expected is not None and len(joined) >= expected
            if may_lead and enough and (full or time.monotonic() >= close_at):
                members = tuple(joined[:_MAX_MEMBERS])
                value = bytes(msgpack.packb(list(members), use_bin_type=True))
                self._store(
                    group_key, self.peer_id, value, dht_time() + _GROUP_TTL, deadline - time.monotonic()
                )
                # Re-read: if a smaller leader published concurrently, adopt its list like everyone else.
                group = self._adopt(kind, round_id, self._get(group_key, deadline - time.monotonic()))
                if group is not None:
                    if group.leader == self.peer_id and self.push is not None:
                        self.push(kind, round_id, members, value)
                    return group
            if self.inbox is not None:  # sleep until a pushed list arrives or the next poll is due
                group = self._adopt(kind, round_id, self.inbox(kind, round_id, self.poll))
                if group is not None:
                    return group
            else:
                time.sleep(self.poll)


def check_deadline(deadline: float, what: str) -> float:
    """Seconds left before ``deadline``; raises ``PeerTimeoutError`` naming ``what`` if none."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise PeerTimeoutError(f"{what}: deadline passed")
    return left
