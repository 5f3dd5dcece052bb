"""``P2PCollective``: butterfly all-reduce and all-gather over hivemind P2P streams.

Butterfly all-reduce (as in Moshpit SGD / hivemind's averager, Ryabinin et al. 2021, but with our own
wire): the flat fp32 concatenation of the tensors is cut into one contiguous partition per member of
the round. Each peer compresses the parts it does not own and pushes them to their owners; an owner
reduces the rows it received plus its own with a ``Reducer`` (token-weighted mean by default),
compresses the aggregate *once* and pushes those bytes to every other member. Every member, the owner
included, decodes the same bytes, so all members end bit-identical. Membership comes from
``peers.rounds.rounds.Matchmaker`` (members push their joins to the likely leader, which pushes the list
back; join windows and round timeouts are measured, ``peers.rounds.deadlines``); every message carries the
group digest. Messages travel on persistent per-peer channels (``peers.wire.channels``), each acknowledged.

Receive budgets: the stream handler, ``peers.rounds.inbound``, reads only admitted senders' messages,
each within its round's budget, into a ``peers.wire.mailbox.Mailbox``.

Structure: this class owns the wire (the stream handler filling the mailbox, the channels, the
matchmaker) and one ``peers.rounds.round_io.RoundIO`` per round, which it hands to the round's
steps: the data phase (``peers.rounds.butterfly``, pipelined per chunk, with the guard's
``peers.rounds.owner_check`` step when a guard is set) and the commit agreement (``peers.rounds.agreement``).
Failure kinds are the exception types of ``peers.rounds.round_errors``.

Failure semantics: a missing, refused or late message, a member's abort or the deadline fails the round
*for this peer* (``committed=False``, no tensors), and it tells the others to abort. A peer commits only
once every member said it holds the full result (``peers.rounds.agreement``; its docstring states the residual
window). A contribution that fails validation is left out of the owner's reduce, for every member.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from peers.dht.node import PeerNode
from peers.rounds.agreement import agree
from peers.rounds.butterfly import NoCheck, ReduceCheck, reduce_round
from peers.rounds.deadlines import Deadlines
from peers.rounds.group import Group
from peers.rounds.inbound import MAX_STREAMS, MAX_STREAMS_PER_PEER, Inbound
from peers.rounds.owner_check import GuardedReduce, OwnerCheck
from peers.rounds.round_errors import QUIET, ListsBannedPeer, RoundLate
from peers.rounds.round_io import PhaseClock, RoundIO, RoundLink
from peers.rounds.rounds import Matchmaker, Pushes
from peers.rounds.seats import Seats
from peers.wire.channels import ChannelPool
from peers.wire.ledger import ByteLedger
from peers.wire.mailbox import (
    PRE_GROUP,
    Delivery,
    Key,
    Mailbox,
    Quota,
    RoundBudget,
    gather_budget,
    reduce_budget,
)
from peers.wire.memory import HeapReturn
from peers.wire.messages import Envelope
from peers.wire.transport import PART_BYTES, send_message, split_bytes
from swarmtrain.core.errors import ConfigError, ProtocolError, SwarmError
from swarmtrain.core.protocols import Compressor, GatherResult, Reducer, RoundResult

if TYPE_CHECKING:
    from peers.rounds.guard import ByzantineGuard

__all__ = ["P2PCollective", "MAX_STREAMS_PER_PEER"]

logger = logging.getLogger(__name__)
_PRE_GROUP_MAX = 16 << 20  # ceiling of the per-sender pre-group data allowance


_T = TypeVar("_T")


@dataclass(frozen=True)
class _Outcome:
    """How one round went for this peer: its number and members, the bytes it sent and received,
    and why it failed (``reason``; ``late``: it fell behind the others)."""

    round_id: int
    members: tuple[str, ...]
    sent: int
    received: int
    reason: str = ""
    late: bool = False


def _check_settings(min_peers: int, expected_peers: int | None, chunk_elems: int, join_window: float) -> None:
    if min_peers < 1 or (expected_peers is not None and expected_peers < min_peers):
        raise ConfigError("need 1 <= min_peers <= expected_peers")
    if not 1 <= chunk_elems <= 1 << 21:
        raise ConfigError("chunk_elems must be in [1, 2**21]")
    if join_window <= 0:
        raise ConfigError("join_window must be > 0")


class P2PCollective:
    """Group communication among the peers of one run, over a :class:`PeerNode`'s P2P streams.

    Implements ``swarmtrain.core.protocols.Collective``. Calls are synchronous and one at a time; every
    call uses the next round number (``round_id``), whether it commits or not, so all peers that make
    the same sequence of calls meet in the same rounds.

    Args:
        node: the started peer node.
        run_id: rounds namespace (default: the node's run ID).
        min_peers: a round is not closed with fewer members.
        expected_peers: close a round as soon as this many joined (else wait ``join_window``).
        ledger: where bytes are counted (default: ``node.ledger``).
        join_window: a leader's wait for joiners: first guess and ceiling of the measured one.
        chunk_elems: the most elements per packet, one stream frame each (<= 2**21); a partition
            is cut into 4 chunks or more while they stay >= 16K elements (``mailbox.chunk_step``).
        max_message_bytes: ceiling on one incoming message (``None``: only each round's own cap, one
            chunk's packet bound; see ``peers.wire.mailbox.reduce_budget``).
        max_gather_bytes: cap on one incoming all-gather payload.
        max_buffer_bytes: ceiling on all buffered incoming bytes (``None``: only the quotas, derived
            per round from the model and the group size, bound them).
        max_streams_per_peer: concurrent incoming streams one peer may hold open.
        guard: owner checks, suspicion records and bans (``peers.rounds.guard``), or ``None``.
        seats: the seat rule for strangers under ``open`` (``peers.rounds.seats``), or ``None``.
    """

    def __init__(
        self,
        node: PeerNode,
        *,
        run_id: str | None = None,
        min_peers: int = 1,
        expected_peers: int | None = None,
        ledger: ByteLedger | None = None,
        join_window: float = 3.0,
        chunk_elems: int = 1 << 20,
        max_message_bytes: int | None = None,
        max_gather_bytes: int = 256 << 20,
        max_buffer_bytes: int | None = None,
        max_streams_per_peer: int = MAX_STREAMS_PER_PEER,
        guard: ByzantineGuard | None = None,
        seats: Seats | None = None,
    ) -> None:
        _check_settings(min_peers, expected_peers, chunk_elems, join_window)
        self.node = node
        self.run_id = run_id or node.run_id
        self.ledger = ledger if ledger is not None else node.ledger
        self.round_id = 0
        self.chunk_elems = chunk_elems
        self.max_message_bytes = max_message_bytes
        self.max_gather_bytes = max_gather_bytes
        self.max_streams_per_peer = max_streams_per_peer
        self.guard, self.seats, self._timeout, self._deadline = guard, seats, 0.0, 0.0
        self.deadlines = Deadlines(join_window)  # measured join windows and timeouts (peers.rounds.deadlines)
        self._mailbox = Mailbox(max_buffer_bytes)
        self._inbound = Inbound(
            node,
            self.run_id,
            self._mailbox,
            self.ledger,
            max_message_bytes=max_message_bytes,
            max_gather_bytes=max_gather_bytes,
            max_streams_per_peer=max_streams_per_peer,
        )
        self.heap = HeapReturn()  # gives the heap back after a flood's data was dropped
        self._matchmaker = Matchmaker(
            node.dht,
            node.peer_id,
            self.run_id,
            Pushes(self._group_inbox, self._push_group, self._push_join, self._connected),
            min_peers=min_peers,
            expected_peers=expected_peers,
            join_window=join_window,
            deadlines=self.deadlines,
            seats=seats,
        )
        # what every round's RoundIO uses; ``self._send`` is looked up here, so a subclass's wins
        self._link = RoundLink(node.peer_id, self.run_id, self._mailbox, self._send, self._connected)
        self._call_lock = threading.Lock()
        self.last_timings: dict[str, float] = {}  # seconds per phase of the last round (diagnostics)
        self.counters: Counter[str] = Counter()  # events across rounds: ``weights_over_cap`` (butterfly)
        self._handler_name = f"swarmtrain.{self.run_id}.collective"
        self._closed = False
        self._channels = ChannelPool(node.p2p, self._handler_name, self.ledger)  # event loop only
        node.loop.run(node.p2p.add_binary_stream_handler(self._handler_name, self._inbound.handle), 15.0)

    @property
    def peer_id(self) -> str:
        """This peer's ID."""
        return self.node.peer_id

    @property
    def banned(self) -> frozenset[str]:
        """The peers this peer currently leaves out of its rounds (the guard's bans)."""
        return self._matchmaker.banned

    def close(self) -> None:
        """Stop accepting collective messages (the node stays up)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.node.loop.run(self._close_channels(), 5.0)
            self.node.loop.run(self.node.p2p.remove_binary_stream_handler(self._handler_name), 5.0)
        except Exception:
            logger.debug("removing the collective handler failed", exc_info=True)

    async def _close_channels(self) -> None:  # on the event loop, which owns the channels
        self._channels.close()

    def __enter__(self) -> P2PCollective:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- send side ------------------------------------------------------------------------------------

    def _send(self, peer: str, env: Envelope, frames: list[Any], deadline: float) -> Future[None]:
        """Send one message to ``peer`` on its persistent channel (``peers.wire.channels``); the future
        resolves once the peer acknowledged it. Aborts go on a fresh stream so they never queue
        behind bulk data."""
        from hivemind.p2p import PeerID

        if env.type == "abort":
            coro: Any = send_message(
                self.node.p2p,
                PeerID.from_base58(peer),
                self._handler_name,
                env,
                frames,
                ledger=self.ledger,
                timeout=max(deadline - time.monotonic(), 0.1),
            )
        else:
            coro = self._channels.send(peer, env, frames, deadline)
        fut = self.node.loop.submit(coro)
        if env.type in ("part", "agg", "gather", "vpart", "vdig"):
            fut.add_done_callback(lambda f: self._on_send_done(f, env))
        return fut

    def _push_group(self, kind: str, round_id: int, members: tuple[str, ...], value: bytes) -> None:
        """Leader: send the round's published member list straight to the members (``peers.rounds.rounds``,
        step 4); fire and forget, the DHT record stays the fallback."""
        env = Envelope(type="grp", run=self.run_id, kind=kind, round=round_id, frames=1, nbytes=len(value))
        deadline = time.monotonic() + 5.0
        for m in members:
            if m != self.peer_id:
                self._send(m, env, [value], deadline)

    def _push_join(self, kind: str, round_id: int, peer: str) -> None:
        """Send this peer's join of a round straight to its likely leader (``peers.rounds.rounds``, step 5);
        fire and forget, the DHT join record stays the fallback."""
        env = Envelope(type="join", run=self.run_id, kind=kind, round=round_id)
        self._send(peer, env, [], time.monotonic() + 5.0)

    def _group_inbox(
        self, kind: str, round_id: int, wait_s: float, n_joins: int
    ) -> tuple[dict[str, object], frozenset[str]]:
        """The group lists and the joins pushed to us for this round so far; waits up to ``wait_s``
        for a list or for more than ``n_joins`` joins."""

        def news(slot: dict[Key, Delivery]) -> bool:
            return any(k[0] == "grp" for k in slot) or sum(k[0] == "join" for k in slot) > n_joins

        if wait_s > 0:
            self._mailbox.wait(kind, round_id, news, time.monotonic() + wait_s)
        slot = self._mailbox.snapshot(kind, round_id)
        lists: dict[str, object] = {
            k[1]: bytes(d.frames[0]) for k, d in slot.items() if k[0] == "grp" and len(d.frames) == 1
        }
        return lists, frozenset(k[1] for k in slot if k[0] == "join")

    def _on_send_done(self, fut: Future[None], env: Envelope) -> None:
        """A failed send wakes up our own waits at once with a local abort marker."""
        if fut.cancelled() or fut.exception() is None:
            return
        marker = Envelope(
            type="abort",
            run=self.run_id,
            kind=env.kind,
            round=env.round,
            digest=env.digest[:16],
            note=str(fut.exception())[:200],
        )
        try:
            self._mailbox.put(Delivery(self.peer_id, marker, ()))
        except ProtocolError:
            pass  # round already over, or a marker is already there

    def _connected(self) -> set[str] | None:
        """The peers with a connection to this one (``None`` when the daemon does not answer)."""
        try:
            infos = self.node.loop.run(self.node.p2p.list_peers(), 5.0)
        except SwarmError:
            return None
        return {str(i.peer_id.to_base58()) for i in infos}

    # --- one round ------------------------------------------------------------------------------------

    def _begin(self, kind: str, timeout: float, budget: Callable[[int], RoundBudget]) -> RoundIO:
        """Take the next round number and form its group; returns the round's I/O.

        Once the group is known, the mailbox drops what non-members sent for the round and holds each
        member to ``budget(group size)``; the next round's pre-group allowance follows that budget."""
        if self._closed:
            raise SwarmError("collective is closed")
        if timeout <= 0:
            raise ConfigError("timeout must be > 0")
        r = self.round_id
        self.round_id = r + 1
        self._mailbox.set_floor(r)
        self._inbound.refusals.reset()  # refusals are logged once per sender and round
        self._timeout = timeout = self.deadlines.round_timeout(timeout)  # the caller's is the ceiling
        self._deadline = deadline = time.monotonic() + timeout
        clock = PhaseClock()
        self.last_timings = clock.phases
        group = self._form_group(kind, r, deadline, clock)
        b = budget(group.size)
        self._inbound.max_streams = max(MAX_STREAMS, 4 * group.size + 16)  # 3 lanes per member
        self._inbound.drain_room(b.per_sender.nbytes)  # a late member's whole round still drains
        self.heap.dropped(self._mailbox.set_group(kind, r, group.members, b))
        pre = min(max(b.message_bytes, PRE_GROUP.nbytes), _PRE_GROUP_MAX)
        n = max(8, 2 * group.size)
        self._mailbox.set_pre_group(Quota(pre, PRE_GROUP.entries), Quota(n * pre, n * PRE_GROUP.entries))
        clock.mark("group")
        return RoundIO(self._link, group, kind, deadline, clock, self.counters)

    def _form_group(self, kind: str, round_id: int, deadline: float, clock: PhaseClock) -> Group:
        """Refresh the guard's bans (if any) and the peers this node no longer admits (a token expired
        or revoked) into the matchmaker, then form the round's group.

        A member that refuses a list holding a banned peer, or a peer this node's own admission check
        does not admit (a leader's list admits nobody), tells the list's members to abort.
        """
        banned = self.node.admitted.refused()
        if self.guard is not None:
            left = max(deadline - time.monotonic(), 0.5)
            banned |= frozenset(self.guard.refresh(min(5.0, left / 4)))
        self._matchmaker.banned = banned
        try:
            group = self._matchmaker.form_group(kind, round_id, deadline)
            self._check_members(group)
            return group
        except ListsBannedPeer as e:
            RoundIO(self._link, e.group, kind, deadline, clock).abort(str(e))
            raise

    def _check_members(self, group: Group) -> None:
        """Raise ``ListsBannedPeer`` unless this node's own admission check admits every member: a
        leader's signed list is no evidence that the peers it names are admitted."""
        admitted = self.node.admitted
        refused = [m for m in group.members if m != self.peer_id and not admitted.check(m)]
        if refused:
            names = [m[:12] for m in refused]
            raise ListsBannedPeer(
                f"round {group.round_id} lists peers this node does not admit {names}", group
            )

    def _failed(self, io: RoundIO | None, kind: str, round_id: int, e: Exception) -> None:
        """This peer failed the round: tell the others to abort unless they learn of it anyway."""
        if io is not None and not isinstance(e, QUIET):
            io.abort(str(e))
        logger.info("round %d (%s) failed: %s", round_id, kind, e)

    def _finish(self, r: int) -> None:
        if "agree" in self.last_timings:  # committed: formation to commit is a sample of its duration
            self.deadlines.observe_round(sum(self.last_timings.values()))
        elif time.monotonic() >= self._deadline:  # ran out of time: a sample of its whole timeout
            self.deadlines.observe_round(self._timeout)
        self._mailbox.set_floor(r + 1)
        if self.seats is not None:  # the certified history for the next round, out of its join window
            self.seats.refresh(2.0)
        self.heap.maybe_trim()
        if self.guard is not None:
            self.guard.publish()
        try:
            self.node.publish(round=self.round_id)
        except SwarmError:
            logger.debug("publishing the round failed", exc_info=True)

    # --- all-reduce ---------------------------------------------------------------------------------

    def all_reduce(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        compressor: Compressor,
        reducer: Reducer | None = None,
        weight: float = 1.0,
        timeout: float = 60.0,
        kind: str = "reduce",
    ) -> RoundResult:
        """Reduce ``tensors`` across the members of the next round (butterfly; see module docstring).

        Args:
            tensors: name -> floating tensor; every peer must pass the same names and shapes. They
                must not change during the call (a single fp32 tensor is read in place, not copied).
            compressor: codec for both the parts sent and the aggregates returned.
            reducer: combines the rows of a partition (``None``: weighted mean, ``MeanReducer``).
            weight: this peer's weight (e.g. tokens processed in the last round), finite, >= 0.
            timeout: seconds for the whole round, group formation included.
            kind: ledger kind.

        Returns:
            ``RoundResult``; when ``committed``, ``tensors`` holds the reduced tensors (same names,
            shapes and dtypes), bit-identical on every member. Otherwise nothing changed locally.
        """
        from peers.reducers import MeanReducer

        if not math.isfinite(weight) or weight < 0:
            raise ConfigError("weight must be finite and >= 0")
        for name, t in tensors.items():
            if not t.is_floating_point():
                raise ConfigError(f"all_reduce: tensor {name!r} is not floating point")
        red: Reducer = reducer if reducer is not None else MeanReducer()
        numel = sum(t.numel() for t in tensors.values())

        def data(io: RoundIO) -> dict[str, torch.Tensor]:
            check = self._reduce_check(io.group)
            return reduce_round(
                io, tensors, compressor, red, float(weight), chunk_elems=self.chunk_elems, check=check
            )

        o, out = self._round(
            kind, timeout, lambda n: reduce_budget(numel, n, self.chunk_elems, compressor), data
        )
        if out is None:
            return RoundResult(
                o.round_id, o.members, o.sent, o.received, False, {}, reason=o.reason, late=o.late
            )
        return RoundResult(o.round_id, o.members, o.sent, o.received, True, out)

    def _round(
        self, kind: str, timeout: float, budget: Callable[[int], RoundBudget], data: Callable[[RoundIO], _T]
    ) -> tuple[_Outcome, _T | None]:
        """One round: the group (``_begin``), its data phase ``data``, the commit agreement; what
        ``data`` returned once every member holds its result, ``None`` when the round failed for this
        peer (the others are told to abort). A round whose group did not form is round -1, not
        finished."""
        with self._call_lock:
            r, io = -1, None
            try:
                io = self._begin(kind, timeout, budget)
                r = io.round_id
                out = data(io)
                agree(io)  # commit only if every member holds its result
                io.mark("agree")
                return _Outcome(r, io.group.members, *self.ledger.round_bytes(kind, r)), out
            except (SwarmError, TimeoutError) as e:
                self._failed(io, kind, r, e)
                members = io.group.members if io is not None else ()
                if self.seats is not None and members:  # its newcomers back off (a seated round)
                    self.seats.failed(members, r, missing=getattr(e, "missing", ()))
                bytes_ = self.ledger.round_bytes(kind, r)
                return _Outcome(r, members, *bytes_, reason=str(e), late=isinstance(e, RoundLate)), None
            finally:
                if io is not None:
                    self._finish(r)

    def _reduce_check(self, group: Group) -> ReduceCheck:
        """The guard's step for this round's reduce: owner check (2+ members), outlier flags, or none."""
        if self.guard is None:
            return NoCheck()
        if self.guard.owner_check and group.size >= 2:
            return OwnerCheck(self.guard)
        return GuardedReduce(self.guard)

    # --- all-gather ---------------------------------------------------------------------------------

    def all_gather(self, payload: bytes, *, timeout: float = 60.0, kind: str = "gather") -> GatherResult:
        """Give ``payload`` to every member of the next round and receive theirs.

        Returns:
            ``GatherResult`` whose ``payloads`` maps every member (this peer included) to its bytes
            when ``committed``.
        """
        if len(payload) > self.max_gather_bytes:
            raise ConfigError(f"payload of {len(payload)} bytes exceeds max_gather_bytes")

        def data(io: RoundIO) -> dict[str, Delivery]:
            frames = split_bytes(payload, PART_BYTES)
            env = io.envelope("gather", index=io.group.index, frames=len(frames), nbytes=len(payload))
            sends = io.send_to_others(env, frames)
            got = io.collect("gather", io.group.digest)
            io.settle(sends)
            return got

        o, got = self._round(kind, timeout, lambda n: gather_budget(self.max_gather_bytes), data)
        if got is None:
            return GatherResult(
                o.round_id, o.members, {}, o.sent, o.received, False, reason=o.reason, late=o.late
            )
        payloads = {p: b"".join(d.frames) for p, d in got.items()}
        payloads[self.peer_id] = bytes(payload)
        return GatherResult(o.round_id, o.members, payloads, o.sent, o.received, True)
