"""The receive side of the collective: a bounded, thread-safe buffer of messages per round.

The stream handler runs on the node's event loop and only *stores* what arrives (after bounds checks)
so the loop never blocks on codec work; the calling thread of ``all_reduce``/``all_gather`` waits on
the mailbox with a deadline and decodes.

Budgets, not hopes (docs/architecture.md, Budgets, not hopes): a message's bytes are *reserved*
(:meth:`Mailbox.reserve`) from its sender's quota before the handler allocates anything for its body, then
stored (:meth:`Mailbox.commit`) or given back (:meth:`Mailbox.release`). What may be held:

* only the current round and the next one (``floor`` and ``floor + 1``); older rounds are purged;
* for a round whose group is known (:meth:`Mailbox.set_group`): only messages of its members, each
  member at most the round's :class:`RoundBudget` (bytes and entries, and one message at most
  ``message_bytes``), derived by the collective from the model, the codec and the group size; what
  non-members sent before is dropped at once;
* for a round whose group is not known yet (a member may send before this peer holds the list): a
  small pre-group allowance per sender and in all (bytes and entries). A message that does not fit
  gets ``None`` from :meth:`Mailbox.reserve` (the handler waits for the group, then asks again);
* optionally, a hard ceiling on all bytes and entries (``max_bytes``/``max_entries``).

A zero-byte message still costs an entry. Refusals are :class:`Refused` (a ``ProtocolError``) that
say whether the stream may go on (the body is drained) or should be closed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from peers.wire.messages import Envelope
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.protocols import Compressor, SizedCompressor

__all__ = [
    "Mailbox",
    "Delivery",
    "Key",
    "Quota",
    "RoundBudget",
    "Refused",
    "Ticket",
    "AHEAD_ROUNDS",
    "PRE_GROUP",
    "CONTROL_TYPES",
    "CONTROL_RESERVE",
    "packet_bound",
    "chunk_step",
    "PIPELINE_CHUNKS",
    "MIN_CHUNK",
    "reduce_budget",
    "gather_budget",
]

Key = tuple[str, str, int]  # (message type, sender, chunk)
Slot = tuple[str, int]  # (kind, round)
AHEAD_ROUNDS = 1  # rounds past the current one that may be buffered (the next round only)


@dataclass(frozen=True)
class Quota:
    """A budget in bytes and in entries (messages; a zero-byte message costs one entry)."""

    nbytes: int
    entries: int


#: default pre-group allowance per sender for data, before the collective derives one from a round
PRE_GROUP = Quota(1 << 20, 16)
#: small control messages of round formation and agreement (a pushed list is at most 128 KiB)
CONTROL_TYPES = frozenset({"grp", "join", "abort", "have"})
#: pre-group room per sender that only control messages may use (so a sender's early data never
#: holds back its pushed list or join), on top of the data allowance; eight senders' worth in all
CONTROL_RESERVE = Quota(2 * 128 * 1024 + 4096, 8)


@dataclass(frozen=True)
class RoundBudget:
    """What one member may have buffered for one round.

    Attributes:
        per_sender: bytes and entries of one member in this round.
        message_bytes: the largest single message of the round.
    """

    per_sender: Quota
    message_bytes: int


class Refused(ProtocolError):
    """A message the mailbox does not take.

    Attributes:
        keep_stream: the sender may go on using the stream (its body is drained, not stored); false
            for senders that have no business sending this (non-members, over quota, oversize).
    """

    def __init__(self, message: str, *, keep_stream: bool) -> None:
        super().__init__(message)
        self.keep_stream = keep_stream


@dataclass(frozen=True)
class Delivery:
    """One received message: who sent it (libp2p-authenticated peer ID), its header and data frames
    (``bytearray`` when read by ``peers.wire.framereader``; treat them as read-only bytes)."""

    sender: str
    env: Envelope
    frames: tuple[bytes, ...]

    @property
    def nbytes(self) -> int:
        """Payload bytes of the data frames."""
        return sum(len(f) for f in self.frames)


@dataclass
class Ticket:
    """Bytes and one entry reserved for a message whose body is being read."""

    sender: str
    slot: Slot
    key: Key
    nbytes: int
    revoked: str = ""  # why it no longer counts (its round's group does not list the sender, ...)


@dataclass
class _Use:
    nbytes: int = 0
    entries: int = 0

    def add(self, nbytes: int, sign: int = 1) -> None:
        self.nbytes += sign * nbytes
        self.entries += sign

    def fits(self, nbytes: int, q: Quota, spare: Quota | None = None) -> bool:
        """Whether one more message of ``nbytes`` fits ``q`` (leaving ``spare`` of it free)."""
        sb, se = (spare.nbytes, spare.entries) if spare is not None else (0, 0)
        return self.nbytes + nbytes <= q.nbytes - sb and self.entries + 1 <= q.entries - se


@dataclass
class _Round:
    """One ``(kind, round)``: stored deliveries, reservations in flight, and, once known, its group."""

    got: dict[Key, Delivery] = field(default_factory=dict)
    held: dict[Key, Ticket] = field(default_factory=dict)
    members: frozenset[str] | None = None
    budget: RoundBudget | None = None
    use: dict[str, _Use] = field(default_factory=dict)  # per sender, deliveries and reservations


class Mailbox:
    """Messages keyed by ``(kind, round)`` then ``(type, sender, chunk)``, within quotas.

    Args:
        max_bytes: ceiling on the payload bytes held (stored and reserved) across all rounds
            (``None``: only the quotas bound them).
        max_entries: ceiling on the messages held (``None``: only the quotas bound them).
        pre_group: data allowance per sender for rounds whose group is not known yet (control
            messages get :data:`CONTROL_RESERVE` on top).
        pre_group_total: the same, for all senders together (default: 8 senders' allowance).
    """

    def __init__(
        self,
        max_bytes: int | None = None,
        *,
        max_entries: int | None = None,
        pre_group: Quota = PRE_GROUP,
        pre_group_total: Quota | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._cond = threading.Condition()
        self._rounds: dict[Slot, _Round] = {}
        self._total = _Use()
        self._pre: dict[str, _Use] = {}  # per sender, in rounds without a known group
        self._pre_total = _Use()
        self._floor = 0  # rounds below this are over
        self._listeners: list[Callable[[], None]] = []
        self.set_pre_group(pre_group, pre_group_total)
        #: payload bytes dropped so far because their sender was not a member (flood evidence)
        self.dropped_bytes = 0

    # --- configuration (calling thread) -------------------------------------------------------------

    def set_pre_group(self, per_sender: Quota, total: Quota | None = None) -> None:
        """Set the pre-group data allowance, per sender and in all (default: 8 senders' worth); the
        control reserve comes on top of both."""
        total = total or Quota(8 * per_sender.nbytes, 8 * per_sender.entries)
        c = CONTROL_RESERVE
        with self._cond:
            self.pre_group = Quota(per_sender.nbytes + c.nbytes, per_sender.entries + c.entries)
            self.pre_group_total = Quota(total.nbytes + 8 * c.nbytes, total.entries + 8 * c.entries)
        self._changed()

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (from any thread) whenever room may have appeared or a group became known,
        so handlers waiting to reserve can try again."""
        self._listeners.append(fn)

    def _changed(self) -> None:
        for fn in list(self._listeners):
            fn()

    def set_floor(self, round_id: int) -> None:
        """Rounds ``< round_id`` are finished: drop their messages and refuse new ones."""
        with self._cond:
            self._floor = max(self._floor, round_id)
            for slot in [s for s in self._rounds if s[1] < self._floor]:
                rd = self._rounds.pop(slot)
                for t in rd.held.values():
                    t.revoked = t.revoked or "its round is over"
                self._forget(rd, rd.use)
            self._cond.notify_all()
        self._changed()

    def set_group(self, kind: str, round_id: int, members: Iterable[str], budget: RoundBudget) -> int:
        """The round's group is known: drop what non-members sent or are sending, count the members'
        messages against ``budget``.

        Returns:
            the payload bytes dropped.
        """
        with self._cond:
            rd = self._rounds.setdefault((kind, round_id), _Round())
            was_pre = rd.members is None
            rd.members, rd.budget = frozenset(members), budget
            outsiders = {s: u for s, u in rd.use.items() if s not in rd.members}
            dropped = sum(u.nbytes for u in outsiders.values())
            for key in [k for k, d in rd.got.items() if d.sender in outsiders]:
                del rd.got[key]
            for key in [k for k, t in rd.held.items() if t.sender in outsiders]:
                rd.held.pop(key).revoked = "sender is not a member of the round's group"
            if was_pre:  # everything still held moves from the pre-group allowance to the members'
                self._unpre(rd.use)
            self._forget(rd, outsiders, pre=False)
            self.dropped_bytes += dropped
        self._changed()
        return dropped

    def _unpre(self, use: dict[str, _Use]) -> None:
        for sender, u in use.items():
            p = self._pre[sender]
            p.nbytes, p.entries = p.nbytes - u.nbytes, p.entries - u.entries
            self._pre_total.nbytes -= u.nbytes
            self._pre_total.entries -= u.entries
            if p.entries <= 0:
                del self._pre[sender]

    def _forget(self, rd: _Round, use: dict[str, _Use], *, pre: bool | None = None) -> None:
        """Take the counts in ``use`` (a round's per-sender usage, or part of it) off every total."""
        if pre is None:
            pre = rd.members is None
        if pre:
            self._unpre(use)
        for sender, u in list(use.items()):
            self._total.nbytes -= u.nbytes
            self._total.entries -= u.entries
            rd.use.pop(sender, None)

    # --- handler side (event loop) ------------------------------------------------------------------

    def _check(self, rd: _Round | None, sender: str, env: Envelope, key: Key) -> None:
        r = env.round
        if r < self._floor or r > self._floor + AHEAD_ROUNDS:
            raise Refused(f"round {r} outside the accepted window from {self._floor}", keep_stream=True)
        if rd is not None and (key in rd.got or key in rd.held):
            raise Refused(f"duplicate {env.type} message for round {r}", keep_stream=True)
        if rd is None or rd.members is None or rd.budget is None:
            return
        if sender not in rd.members:
            raise Refused(f"not a member of round {r}'s group", keep_stream=False)
        if env.nbytes > rd.budget.message_bytes:
            raise Refused(
                f"message of {env.nbytes} bytes exceeds round {r}'s {rd.budget.message_bytes}-byte cap",
                keep_stream=False,
            )
        if not rd.use.get(sender, _Use()).fits(env.nbytes, rd.budget.per_sender):
            raise Refused(f"sender over its quota for round {r}", keep_stream=False)

    def _global_fits(self, nbytes: int) -> bool:
        over_bytes = self.max_bytes is not None and self._total.nbytes + nbytes > self.max_bytes
        over_entries = self.max_entries is not None and self._total.entries + 1 > self.max_entries
        return not (over_bytes or over_entries)

    def reserve(self, sender: str, env: Envelope) -> Ticket | None:
        """Reserve ``env.nbytes`` bytes and one entry for a message from ``sender``.

        Returns:
            the reservation, or ``None`` when the round's group is not known yet and the pre-group
            allowance has no room (ask again after a listener call).

        Raises:
            Refused: outside the window, duplicate, non-member, oversize, over quota, or (group
                known) the global ceiling reached.
        """
        slot, key = (env.kind, env.round), (env.type, sender, env.chunk)
        with self._cond:
            rd = self._rounds.get(slot)
            self._check(rd, sender, env, key)
            known = rd is not None and rd.members is not None
            if not known:
                c = CONTROL_RESERVE
                spare, spare_total = (
                    (None, None) if env.type in CONTROL_TYPES else (c, Quota(8 * c.nbytes, 8 * c.entries))
                )
                pre = self._pre.get(sender, _Use())
                if not (
                    pre.fits(env.nbytes, self.pre_group, spare)
                    and self._pre_total.fits(env.nbytes, self.pre_group_total, spare_total)
                ):
                    return None
            if not self._global_fits(env.nbytes):
                if not known:
                    return None
                raise Refused("receive buffer full", keep_stream=False)
            rd = rd if rd is not None else self._rounds.setdefault(slot, _Round())
            ticket = Ticket(sender, slot, key, env.nbytes)
            rd.held[key] = ticket
            rd.use.setdefault(sender, _Use()).add(env.nbytes)
            self._total.add(env.nbytes)
            if not known:
                self._pre.setdefault(sender, _Use()).add(env.nbytes)
                self._pre_total.add(env.nbytes)
            return ticket

    def _unhold(self, ticket: Ticket, nbytes: int) -> _Round | None:
        """Drop a live reservation's counts; returns its round (``None`` if it is gone)."""
        rd = self._rounds.get(ticket.slot)
        if ticket.revoked or rd is None or rd.held.get(ticket.key) is not ticket:
            return None
        del rd.held[ticket.key]
        u = rd.use[ticket.sender]
        u.add(nbytes, -1)
        self._total.add(nbytes, -1)
        if rd.members is None:
            self._pre[ticket.sender].add(nbytes, -1)
            self._pre_total.add(nbytes, -1)
            if self._pre[ticket.sender].entries <= 0:
                del self._pre[ticket.sender]
        if u.entries <= 0:
            del rd.use[ticket.sender]
        return rd

    def release(self, ticket: Ticket) -> None:
        """Give back a reservation whose message was not stored."""
        with self._cond:
            rd = self._unhold(ticket, ticket.nbytes)
            if rd is not None and not rd.got and not rd.held and rd.members is None:
                del self._rounds[ticket.slot]
        self._changed()

    def commit(self, ticket: Ticket, d: Delivery) -> None:
        """Store the message a reservation was made for (its bytes are at most the reserved ones).

        Raises:
            Refused: the reservation was revoked meanwhile (round over, or its group does not list
                the sender).
        """
        with self._cond:
            if ticket.revoked:
                raise Refused(ticket.revoked, keep_stream=ticket.revoked.startswith("its round"))
            rd = self._unhold(ticket, ticket.nbytes)
            if rd is None:
                raise Refused("reservation lost", keep_stream=True)
            rd.got[ticket.key] = d
            rd.use.setdefault(d.sender, _Use()).add(d.nbytes)
            self._total.add(d.nbytes)
            if rd.members is None:
                self._pre.setdefault(d.sender, _Use()).add(d.nbytes)
                self._pre_total.add(d.nbytes)
            self._cond.notify_all()

    def put(self, d: Delivery) -> None:
        """Store a delivery at once (local abort markers, tests): :meth:`reserve` then :meth:`commit`.

        Raises:
            ProtocolError: refused (see :meth:`reserve`), or no pre-group room.
        """
        env = d.env if d.env.nbytes == d.nbytes else _with_nbytes(d.env, d.nbytes)
        ticket = self.reserve(d.sender, env)
        if ticket is None:
            raise Refused("no room before the round's group is known", keep_stream=False)
        self.commit(ticket, d)

    # --- calling thread -----------------------------------------------------------------------------

    def wait(
        self,
        kind: str,
        round_id: int,
        ready: Callable[[dict[Key, Delivery]], bool],
        deadline: float,
    ) -> dict[Key, Delivery] | None:
        """Block until ``ready(slot)`` holds for the round's messages or ``deadline`` (monotonic) passes.

        Returns:
            a snapshot of the round's messages, or ``None`` on timeout.
        """
        with self._cond:
            while True:
                slot = self._snapshot((kind, round_id))
                if ready(slot):
                    return slot
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))

    def _snapshot(self, slot: Slot) -> dict[Key, Delivery]:
        rd = self._rounds.get(slot)
        return dict(rd.got) if rd is not None else {}

    def snapshot(self, kind: str, round_id: int) -> dict[Key, Delivery]:
        """The round's messages received so far."""
        with self._cond:
            return self._snapshot((kind, round_id))

    @property
    def buffered_bytes(self) -> int:
        """Payload bytes currently held (stored and reserved)."""
        with self._cond:
            return self._total.nbytes

    @property
    def buffered_entries(self) -> int:
        """Messages currently held (stored and reserved)."""
        with self._cond:
            return self._total.entries


_PACKET_SLACK = 4096  # bytes of a packet's msgpack header beyond its payload
_CONTROL_BYTES = 128 * 1024 + 64 * 1024  # a member's control messages in one round (list, have...)
_CONTROL_ENTRIES = 16


def packet_bound(compressor: Compressor, numel: int) -> int:
    """The most bytes an encoded packet of ``numel`` elements takes: the codec's exact payload size
    (``payload_nbytes``) plus its header, or 8 bytes per element for a codec that does not say."""
    try:
        payload = compressor.payload_nbytes(numel) if isinstance(compressor, SizedCompressor) else 8 * numel
    except Exception:  # a codec that cannot size this input: the generous fallback
        payload = 8 * numel
    return payload + _PACKET_SLACK


PIPELINE_CHUNKS = 4  # chunks a partition is cut into at least, while they stay >= MIN_CHUNK elements
MIN_CHUNK = 1 << 14


def chunk_step(numel: int, group_size: int, chunk_elems: int) -> int:
    """Elements per chunk of an all-reduce of ``numel`` elements among ``group_size`` members: the
    largest partition cut into :data:`PIPELINE_CHUNKS` chunks (never below :data:`MIN_CHUNK`), at
    most ``chunk_elems``. Every member computes the same from the round's facts.

    An owner reduces and returns a chunk as soon as all its parts arrived, so with several chunks a
    partition's aggregates flow back while its later parts still travel: the two halves of the
    butterfly overlap instead of costing a one-way trip each in turn. One chunk per partition (the
    old cut at ``chunk_elems`` = 2**20 for a model of a few million elements) left 3.8 round trips
    above the link's transfer time in the exchange across 150 ms regions. Each chunk is a message,
    whose CPU a loopback round feels: 4 chunks, not 8 (``docs/decisions.md``)."""
    part = -(-numel // max(group_size, 1))  # the largest partition
    return max(1, min(chunk_elems, part, max(MIN_CHUNK, -(-part // PIPELINE_CHUNKS))))


def reduce_budget(numel: int, group_size: int, chunk_elems: int, compressor: Compressor) -> RoundBudget:
    """What one member may send this peer in one all-reduce round: the chunks of this peer's partition
    (parts), of its own (aggregates) and of the one this peer verifies (``vpart``), one packet bound
    each, their digests, and the round's control messages; one message is at most one chunk's packet."""
    part = -(-numel // max(group_size, 1))  # the largest partition
    chunk = chunk_step(numel, group_size, chunk_elems)
    n_chunks = -(-part // chunk)
    msg = packet_bound(compressor, chunk)
    per = Quota(3 * n_chunks * msg + 256 * n_chunks + _CONTROL_BYTES, 4 * n_chunks + _CONTROL_ENTRIES)
    return RoundBudget(per, max(msg, 128 * 1024))


def gather_budget(max_gather_bytes: int) -> RoundBudget:
    """What one member may send this peer in one all-gather round: one payload and control messages."""
    return RoundBudget(
        Quota(max_gather_bytes + _CONTROL_BYTES, _CONTROL_ENTRIES), max(max_gather_bytes, 128 * 1024)
    )


def _with_nbytes(env: Envelope, nbytes: int) -> Envelope:
    from dataclasses import replace

    return replace(env, nbytes=nbytes)
