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
5. *Pushed joins* (the same kind of shortcut for step 1): a peer also sends its join straight to the
   likely leader, the smallest member of the last group it was in that it still has a connection to
   and has not banned (a ``join`` message, authenticated
   the same way, so a peer can only join as itself). A peer that may lead counts pushed joins like
   join records and wakes up when one arrives, so it closes the round as soon as the last join
   reaches it rather than at its next DHT poll; its join store is not waited for either (the record
   is the fallback for a push that went to the wrong peer). A leader still reads the join records at
   least once before it closes, so a smaller newcomer that only wrote its record is seen; and a peer
   that may lead reads the group key beside them, so one that arrives after the others formed the
   round (a newcomer with the smallest ID) is late instead of leading a round of its own.
6. *Dead leader.* A member waiting for the list checks every ``LEADER_CHECK_S`` seconds that the peer
   it expects to lead (the smallest joiner, the join records re-read for each check: a leader whose
   record arrived late is still the one watched) is still connected. A leader that dropped out
   after it was seen connected (or after a group with this peer) fails the wait at once (``MemberGone``)
   instead of at the deadline: a leader killed between closing the round and its push reaching every
   member otherwise leaves those members waiting a whole deadline while the others have moved on, so
   the survivors would enter the next round a deadline apart and miss each other's join window.
   Members of the last group that have no connection any more at the start of a round are not
   expected in it: a leader waiting for ``expected_peers`` does not wait its whole join window for
   peers it knows are gone, so survivors that noticed a death a few seconds apart still meet.
   A leader this peer never saw connected (a restarted or new peer knows no last group) is gone too
   once it has neither connected nor published a list for the hand-set join window plus
   ``2 * LEADER_CHECK_S`` while enough peers (``min_peers``) joined: a live leader closes within its
   join window and its push opens a connection to each member. Without this, a restarted peer whose
   leader died just before its round waited the whole round deadline (its first, unmeasured one:
   the hand-set ceiling), the survivors moved on round after round without it, and one survivor
   ended the run alone on a stale state (``simulate --chaos``: peers not identical).

Under ``open``, once the run has a certified history, a ``peers.rounds.seats.Seats`` rule (given as
``seats``) changes steps 2, 3 and 5: only an *established* peer leads (the smallest established
joiner, so a list's leader is no longer always its smallest member), a leader seats a bounded share
of newcomers and does not close early without the established members of its last group, and a
member refuses a list that seats too many (``TooManyNewcomers``).

Consistency: the member list is never inferred locally from a partial view, it is always one leader's
published list, and every data message of the round carries the group digest (a hash of run, kind,
round and members). If two leaders ever published competing lists (they could not see each other),
a peer holding the other list's digest refuses the messages, so the round fails (``committed=False``)
rather than mixing members: no peer commits with a membership another member disagrees with. A
leader pushes its list first and stores the record without waiting; it does not re-read the group key
for a concurrent smaller leader, a check that could only narrow that race (the other leader may
publish just after the re-read), never close it: the digest closes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from peers.rounds.deadlines import Deadlines
from peers.rounds.group import Group, group_digest
from peers.rounds.round_errors import ListsBannedPeer, MemberGone, RoundLate, RoundTimeout
from peers.rounds.seats import Seats, TooManyNewcomers
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.safe_msgpack import unpack

__all__ = ["Group", "Pushes", "Matchmaker", "group_digest"]

logger = logging.getLogger(__name__)
_MAX_MEMBERS = 1024
_GROUP_TTL = 600.0
#: seconds between the checks that the expected leader is still connected (step 6)
LEADER_CHECK_S = 2.0


@dataclass(frozen=True)
class Pushes:
    """Direct delivery between the members of a round (steps 4 and 5), provided by the collective.

    Attributes:
        inbox: ``inbox(kind, round, wait_s, n_joins)`` waits up to ``wait_s`` seconds for a pushed list
            or for more than ``n_joins`` pushed joins; returns ``({sender: record bytes}, joiners)``.
        group: ``group(kind, round, members, value)`` sends a published list to the members.
        join: ``join(kind, round, peer)`` sends this peer's join to ``peer``.
        connected: the peer IDs with a live connection to this one (``None``: unknown), for step 6.
    """

    inbox: Callable[[str, int, float, int], tuple[dict[str, object], frozenset[str]]]
    group: Callable[[str, int, tuple[str, ...], bytes], None]
    join: Callable[[str, int, str], None]
    connected: Callable[[], set[str] | None] = lambda: None


def _log_failed_store(fut: Any, key: str) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        logger.warning("DHT store of %s failed: %s", key, fut.exception())


def _decode_members(value: object) -> tuple[str, ...]:
    """The member list of a group record (published or pushed): sorted, unique, non-empty peer IDs.

    Raises:
        ProtocolError: anything else.
    """
    if not isinstance(value, bytes):
        raise ProtocolError("group record is not bytes")
    obj = unpack(
        value, what="group record", max_bytes=128 * _MAX_MEMBERS, max_str=128, max_array=_MAX_MEMBERS
    )
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
        pushes: direct delivery of joins and lists between members (steps 4 and 5).
        min_peers: a leader does not close a round with fewer joiners.
        expected_peers: close as soon as this many joined (``None``: wait the whole join window).
        join_window: seconds a leader waits for joiners after its own arrival: with ``deadlines``,
            the first guess and the ceiling of the measured window (``peers.rounds.deadlines``).
        poll: seconds between DHT polls.
        deadlines: measured join windows (``None``: always ``join_window``).
        seats: the seat rule for strangers under ``open`` (``peers.rounds.seats``), or ``None``.
    """

    def __init__(
        self,
        dht: object,
        peer_id: str,
        run_id: str,
        pushes: Pushes,
        *,
        min_peers: int = 1,
        expected_peers: int | None = None,
        join_window: float = 3.0,
        poll: float = 0.05,
        deadlines: Deadlines | None = None,
        seats: Seats | None = None,
    ) -> None:
        self.dht = dht
        self.peer_id = peer_id
        self.run_id = run_id
        self.min_peers = min_peers
        self.expected_peers = expected_peers
        self.join_window = join_window
        self.deadlines = deadlines
        #: the join window of the round being formed (seconds), for the log and the tests
        self.window_used = join_window
        self.poll = poll
        self.pushes = pushes
        self.seats = seats
        #: peers excluded from rounds (the guard's bans, ``peers.rounds.guard``): a leader leaves them out of
        #: its list and a member refuses a published list that holds one
        self.banned: frozenset[str] = frozenset()
        #: members of the last group this peer was in (its smallest is the likely next leader)
        self.last_members: tuple[str, ...] = ()
        #: members of the last group gone by the start of the current round (``form_group``)
        self._departed: frozenset[str] = frozenset()

    def _key(self, kind: str, round_id: int, what: str) -> str:
        return f"{self.run_id}.{kind}.{round_id}.{what}"

    def _get(self, key: str, timeout: float, started: Any = None) -> dict[str, object]:
        """The live subkeys of ``key``; ``started``: a read of it already under way (``_start_get``)."""
        from peers.dht.node import dht_time

        fut = started if started is not None else self._start_get(key)
        try:
            found = fut.result(max(timeout, 0.5))
        except TimeoutError:
            return {}
        if found is None or not isinstance(found.value, dict):
            return {}
        now = dht_time()
        return {k: v.value for k, v in found.value.items() if isinstance(k, str) and v.expiration_time >= now}

    def _start_get(self, key: str) -> Any:
        return self.dht.get(key, latest=True, return_future=True)  # type: ignore[attr-defined]

    def _store(self, key: str, subkey: str, value: bytes, expiration: float) -> None:
        """Store without waiting: the DHT process completes it; a failure is only logged (every record
        is a fallback for a push)."""
        fut = self.dht.store(key, value, expiration, subkey=subkey, return_future=True)  # type: ignore[attr-defined]
        fut.add_done_callback(lambda f: _log_failed_store(f, key))

    def _adopt(self, kind: str, round_id: int, records: dict[str, object]) -> Group | None:
        """The valid published list with the smallest leader ID, if any."""
        for leader in sorted(records):
            try:
                members = _decode_members(records[leader])
            except ProtocolError as e:
                logger.warning("ignoring a bad group record from %s: %s", leader[:16], e)
                continue
            if not self._leads(leader, members, round_id):
                logger.info("ignoring group record of %s: not a leader of this list", leader[:16])
                continue
            if leader in self.banned - {self.peer_id}:  # a banned leader cannot capture the round
                logger.info("ignoring group record of banned %s", leader[:16])
                continue
            if self.peer_id not in members:
                raise RoundLate(f"late: round {round_id} was formed without this peer")
            group = self._group_of(kind, round_id, members, leader)
            bad = sorted(set(members) & (self.banned - {self.peer_id}))
            if bad:
                raise ListsBannedPeer(f"round {round_id} lists banned peers {[b[:12] for b in bad]}", group)
            why = self._breaks_seats(members, round_id)
            if why:
                raise TooManyNewcomers(f"round {round_id}: {why}", group)
            return group
        return None

    def _leads(self, leader: str, members: tuple[str, ...], round_id: int) -> bool:
        """Whether ``leader`` may have published ``members``: its smallest member, or under the seat
        rule an established member (the history read again once before a list naming this peer is
        ignored: this peer's view may lag the leader's)."""
        if self.seats is None:
            return members[0] == leader
        ok = self.seats.may_lead(leader, members, round_id)
        if not ok and self.peer_id in members and self.seats.recheck():
            ok = self.seats.may_lead(leader, members, round_id)
        return ok

    def _breaks_seats(self, members: tuple[str, ...], round_id: int) -> str | None:
        """Why a list breaks the seat rule in this peer's view, read again once before it refuses."""
        if self.seats is None:
            return None
        why = self.seats.breaks(members, round_id)
        if why and self.seats.recheck():
            why = self.seats.breaks(members, round_id)
        return why

    def _leader(self, joined: list[str], round_id: int) -> str | None:
        """Who leads a round these (sorted) joiners joined: the smallest, or the seat rule's pick."""
        return joined[0] if self.seats is None else self.seats.leader(joined, round_id)

    def _group_of(self, kind: str, round_id: int, members: tuple[str, ...], leader: str) -> Group:
        return Group(
            kind=kind,
            round_id=round_id,
            members=members,
            leader=leader,
            digest=group_digest(self.run_id, kind, round_id, members),
            index=members.index(self.peer_id),
        )

    def form_group(self, kind: str, round_id: int, deadline: float) -> Group:
        """Join round ``round_id`` of ``kind`` and return its fixed membership.

        Args:
            deadline: ``time.monotonic()`` by which the group must be known.

        Raises:
            RoundLate: the round formed without this peer.
            ListsBannedPeer: the round's list holds a banned peer.
            RoundTimeout: no group by the deadline.
        """
        from peers.dht.node import dht_time

        join_key = self._key(kind, round_id, "join")
        group_key = self._key(kind, round_id, "group")
        arrived = time.monotonic()
        self.window_used = self.deadlines.join_window() if self.deadlines else self.join_window
        close_at = arrived + self.window_used
        ttl = max(deadline - arrived, 0.0) + 60.0
        self._departed = self._gone_since_last_group()
        others = sorted(set(self.last_members) - self._departed - self.banned)
        likely = (self._leader(others, round_id) if others else None) or self.peer_id
        if likely != self.peer_id:  # (under the seat rule the likely leader may have a larger ID)
            self.pushes.join(kind, round_id, likely)  # step 5; the record below is the fallback
        self._store(join_key, self.peer_id, b"1", dht_time() + ttl)
        # both first reads start beside the store: a round formed before we arrived shows in its group
        # record, which a newcomer (no last group, so no pushed list) must not miss
        first = (self._start_get(join_key), self._start_get(group_key))
        if self.seats is not None and not self.seats.was_read:  # a first round: the history now
            self.seats.refresh(min(2.0, max(deadline - arrived, 0.5) / 4))  # (then after each round)
        group = self._gather(kind, round_id, deadline, close_at, join_key, group_key, first)
        self.last_members = group.members
        return group

    def _inbox(
        self, kind: str, round_id: int, wait_s: float, n_joins: int
    ) -> tuple[Group | None, frozenset[str]]:
        """A pushed list adopted (or ``None``) and the pushed joiners so far (steps 4 and 5)."""
        lists, joins = self.pushes.inbox(kind, round_id, wait_s, n_joins)
        return self._adopt(kind, round_id, lists), joins

    def _gather(
        self,
        kind: str,
        round_id: int,
        deadline: float,
        close_at: float,
        join_key: str,
        group_key: str,
        first_read: tuple[Any, Any] | None,
    ) -> Group:
        """Steps 2-5 once this peer's join is out: lead and publish, or adopt the leader's list."""
        # A peer that may still lead reads the joins and the group key side by side each poll (one
        # round trip): a smaller leader's list reaches it by push, but a round a larger leader formed
        # before it arrived (it is late) shows only in the group record. A pushed join alone needs no
        # new read. A peer that saw a smaller joiner never leads this round (join records only
        # accumulate) and reads the group key only, the fallback for a lost push.
        g = _Gathered(*self._inbox(kind, round_id, 0.0, -1))
        read_joins = True
        grace = self.join_window + 2 * LEADER_CHECK_S  # a live leader's list comes by then
        watch = _LeaderWatch(self.pushes.connected, set(self.last_members) - {self.peer_id}, grace)
        seen_at: dict[str, float] = {}  # when each joiner was first seen (a leader's join spread)
        while True:
            if g.group is not None:
                return g.group
            left = deadline - time.monotonic()
            if left <= 0:
                raise RoundTimeout(f"no group for round {round_id} before the deadline")
            if not g.may_lead:
                self._follow(g, kind, round_id, deadline, (join_key, group_key), watch)
                continue
            if read_joins:
                reads = first_read or (self._start_get(join_key), self._start_get(group_key))
                first_read = None
                g.recorded |= set(self._get(join_key, left, reads[0]))
                g.group = self._adopt(
                    kind, round_id, self._get(group_key, deadline - time.monotonic(), reads[1])
                )
                if g.group is not None:
                    return g.group
            joined = self._joiners(g.recorded | g.pushed)
            g.may_lead = self._note_leader(g, joined, round_id) == self.peer_id
            now = time.monotonic()
            for p in joined:
                seen_at.setdefault(p, now)
            seated = self._seat(joined, round_id) if g.may_lead else ()
            if seated and self._may_close(joined, seated, close_at, round_id):
                if self.deadlines is not None:  # when each member it takes in (itself too) arrived
                    arrived = close_at - self.window_used
                    self.deadlines.observe_arrivals(seen_at[p] - arrived for p in seated)
                return self._publish(kind, round_id, seated, group_key)
            # sleep until a pushed list or join arrives or the next poll is due; a pushed join alone
            # needs no new DHT read (the records were read at least once; they are re-read each poll)
            n_before = len(g.pushed)
            t0 = time.monotonic()
            g.group, g.pushed = self._inbox(kind, round_id, self.poll, n_before)
            read_joins = len(g.pushed) == n_before or time.monotonic() - t0 >= self.poll

    def _follow(
        self,
        g: _Gathered,
        kind: str,
        round_id: int,
        deadline: float,
        keys: tuple[str, str],
        watch: _LeaderWatch,
    ) -> None:
        """A peer that does not lead: wait for the leader's list, pushed or read from the DHT next poll
        (a slow read must not hold up the leader check); step 6 when the leader check is due."""
        join_key, group_key = keys
        left = deadline - time.monotonic()
        g.group = self._adopt(kind, round_id, self._get(group_key, min(left, LEADER_CHECK_S)))
        if g.group is None:
            g.group, g.pushed = self._inbox(kind, round_id, self.poll, len(g.pushed))
        if g.group is None and watch.due():  # step 6, on a fresh view of the joiners
            g.recorded |= set(self._get(join_key, min(deadline - time.monotonic(), LEADER_CHECK_S)))
            joined = self._joiners(g.recorded | g.pushed)
            leader = self._note_leader(g, joined, round_id)
            if leader is not None and self.peer_id < leader and self.seats and self.seats.recheck():
                # the others may count this peer as established while its own view does not (a
                # restarted peer's first read): they wait for its list as it waits for theirs
                leader = self._note_leader(g, joined, round_id)
            g.may_lead = leader == self.peer_id
            if leader is not None:
                watch.check(leader, round_id, quorum=len(joined) >= self.min_peers)

    def _note_leader(self, g: _Gathered, joined: list[str], round_id: int) -> str | None:
        """:meth:`_leader` of these joiners, logged (debug) when it differs from the last one seen."""
        leader = self._leader(joined, round_id)
        if leader != g.leader:
            g.leader = leader
            est = None if self.seats is None else sorted(p[:8] for p in self.seats.established(round_id))
            logger.debug("round %d: joined %s, leader %s, established %s", round_id,
                         [p[:8] for p in joined], leader and leader[:8], est)  # fmt: skip
        return leader

    def _joiners(self, seen: set[str] | frozenset[str]) -> list[str]:
        """The joiners this peer knows of, itself included and the banned left out, sorted (the first
        one leads)."""
        return sorted((set(seen) | {self.peer_id}) - (self.banned - {self.peer_id}))

    def _gone_since_last_group(self) -> frozenset[str]:
        """Members of this peer's last group it has no connection to any more (they left or died):
        not expected back this round (empty when the connections are unknown)."""
        others = set(self.last_members) - {self.peer_id}
        live = self.pushes.connected() if others else None
        return frozenset() if live is None else frozenset(others - live)

    def _seat(self, joined: list[str], round_id: int) -> tuple[str, ...]:
        """The list a leader publishes from these joiners: all of them, or the seat rule's pick."""
        seated = tuple(joined) if self.seats is None else self.seats.seat(joined, round_id, self.min_peers)
        return seated[:_MAX_MEMBERS]

    def _may_close(self, joined: list[str], seated: tuple[str, ...], close_at: float, round_id: int) -> bool:
        """Whether a leader with these joiners (``seated`` of them on its list) closes the round now:
        enough seated, and all that are expected joined (but the banned ones and the members of the
        last group that have gone; under the seat rule, every established member of the last group
        still there among them) or the join window is over."""
        full = False
        if self.expected_peers is not None:
            absent = (self.banned | self._departed) - set(joined)
            full = len(joined) >= self.expected_peers - len(absent)
            if full and self.seats is not None:
                there = set(self.last_members) - self._departed - self.banned
                full = not self.seats.waiting(there, joined, round_id)
        return len(seated) >= self.min_peers and (full or time.monotonic() >= close_at)

    def _publish(self, kind: str, round_id: int, members: tuple[str, ...], group_key: str) -> Group:
        """Leader: push the list to the members (they start at once), store the record (their
        fallback)."""
        from peers.dht.node import dht_time

        value = bytes(msgpack.packb(list(members), use_bin_type=True))
        self.pushes.group(kind, round_id, members, value)
        self._store(group_key, self.peer_id, value, dht_time() + _GROUP_TTL)
        return self._group_of(kind, round_id, members, self.peer_id)


@dataclass
class _Gathered:
    """What a peer gathering a round's group knows so far (``Matchmaker._gather``)."""

    group: Group | None  # the round's list, once adopted
    pushed: frozenset[str]  # joiners that pushed their join to this peer
    recorded: set[str] = field(default_factory=set)  # joiners seen in the DHT records
    may_lead: bool = True  # no smaller joiner seen yet
    leader: str | None = ""  # the leader of the joiners last seen ("": none computed yet)


class _LeaderWatch:
    """Step 6: whether the peer expected to lead a round is still there, checked every
    ``LEADER_CHECK_S`` seconds.

    A peer known to have been up (connected at an earlier check, or a member of this peer's last
    group) is gone when it has no connection any more. One this peer never had a connection to may
    simply not have dialled it yet: it is gone only when, with enough joiners for it to close the
    round, it stayed unconnected for ``grace`` seconds since it was first watched (a live leader
    would have closed the round and pushed its list by then).
    """

    def __init__(self, connected: Callable[[], set[str] | None], known: set[str], grace: float) -> None:
        self.connected = connected
        self.known = known
        self.grace = grace
        self.next_at = time.monotonic()
        self._unseen_since: dict[str, float] = {}  # leaders never connected: when first watched

    def due(self) -> bool:
        """Whether a check is due (and, if so, the next one is scheduled)."""
        now = time.monotonic()
        if now < self.next_at:
            return False
        self.next_at = now + LEADER_CHECK_S
        return True

    def check(self, leader: str, round_id: int, *, quorum: bool = True) -> None:
        """Raise ``MemberGone`` if ``leader`` was up and has no connection any more, or (``quorum``:
        enough peers joined for it to close) was never connected to in ``grace`` seconds."""
        live = self.connected()
        if live is None:
            return
        if leader in live:
            self.known.add(leader)
        elif leader in self.known:
            raise MemberGone(f"leader {leader[:12]} of round {round_id} disconnected before its list arrived")
        else:
            now = time.monotonic()
            since = self._unseen_since.setdefault(leader, now)
            if quorum and now - since >= self.grace:
                raise MemberGone(
                    f"leader {leader[:12]} of round {round_id} neither connected nor sent its list "
                    f"in {now - since:.0f} s"
                )
