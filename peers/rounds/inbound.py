"""The receive side of ``peers.rounds.collective``: the stream handler that reads the round messages
peers send into the collective's mailbox, each within a receive budget, and acknowledges each.

Receive budgets (docs/architecture.md, Budgets, not hopes): only admitted senders
(``peers.trust.admission``); capped streams per peer and in all; a whole-message deadline and minimum
rate (``peers.wire.framereader``); a body read only after its bytes were reserved in the mailbox
(``peers.wire.mailbox``): members within the round's budget, others within a small pre-group allowance
until the group is known. Refusals are ``ProtocolError`` acks; a refused body is drained when the stream
may stay in step, within :data:`DRAIN_PER_MINUTE` bytes per sender (past it the stream is closed
instead: a member that sends duplicates or messages for rounds long gone cannot make this peer read
without bound).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from peers.dht.node import PeerNode
from peers.rounds.agreement import HAVE
from peers.wire.budgets import RequesterBudget
from peers.wire.channels import IDLE_CLOSE
from peers.wire.framereader import MessageClock
from peers.wire.framereader import attach as attach_frame_reader
from peers.wire.ledger import ByteLedger
from peers.wire.mailbox import Delivery, Mailbox, Refused, Ticket
from peers.wire.messages import Envelope, decode_envelope, encode_ack
from peers.wire.refusals import RefusalLog
from peers.wire.transport import read_data_frames, read_header, skip_data_frames, write_frame
from swarmtrain.core.errors import PeerTimeoutError, ProtocolError, SwarmError

__all__ = ["Inbound", "DRAIN_PER_MINUTE", "MAX_STREAMS", "MAX_STREAMS_PER_PEER"]

logger = logging.getLogger("peers.rounds.collective")  # the lines keep the collective's logger name
_FRAME_TIMEOUT = 30.0
_GROUP_BYTES = 128 * 1024  # cap on a pushed member list (peers.rounds.rounds allows 1024 IDs)
_MESSAGE_TYPES = ("part", "agg", "gather", "abort", HAVE, "vpart", "vdig", "grp", "join")
#: concurrent incoming streams per peer (a channel uses three lanes, aborts one-shot streams)
MAX_STREAMS_PER_PEER = 8
#: concurrent incoming streams from all peers together (the collective raises it for large groups)
MAX_STREAMS = 256
_TYPE_CAPS = {"grp": _GROUP_BYTES, "join": 0, HAVE: 0, "abort": 0}  # join/have/abort carry no frames
_GROUP_WAIT = 30.0  # seconds a message waits for room until its round's group is known
#: bytes of refused messages one sender may make this peer read (drain) per minute, at least (the
#: collective raises it to two rounds of a member's budget: an honest straggler's late parts fit);
#: past it a refusal closes the stream instead (the sender opens another)
DRAIN_PER_MINUTE = 64 << 20


class Inbound:
    """Reads messages from the streams peers open to the collective's handler into ``mailbox``.

    Args:
        node: the started peer node (its admission policy and event loop).
        run_id: messages for another run are refused.
        mailbox: where accepted messages land; its listeners wake the handlers waiting for room.
        ledger: where received bytes are counted.
        max_message_bytes: ceiling on one incoming message (``None``: only its round's budget).
        max_gather_bytes: cap on one incoming all-gather payload.
        max_streams_per_peer: concurrent incoming streams one peer may hold open.

    ``max_streams`` (all peers together) and ``refusals`` (logged once per sender and round) are
    the collective's to adjust per round. Handlers run on the event loop only.
    """

    def __init__(
        self,
        node: PeerNode,
        run_id: str,
        mailbox: Mailbox,
        ledger: ByteLedger,
        *,
        max_message_bytes: int | None,
        max_gather_bytes: int,
        max_streams_per_peer: int,
    ) -> None:
        self._node = node
        self.run_id = run_id
        self.mailbox = mailbox
        self.ledger = ledger
        self.max_message_bytes = max_message_bytes
        self.max_gather_bytes = max_gather_bytes
        self.max_streams_per_peer = max_streams_per_peer
        self.max_streams = MAX_STREAMS
        self.refusals = RefusalLog()
        self.drained = RequesterBudget(DRAIN_PER_MINUTE, window_s=60.0)  # refused bytes read, per sender
        self.streams: dict[str, int] = {}  # open incoming streams per peer (event loop only)
        self._room: asyncio.Future[None] | None = None  # resolved when the mailbox may take more
        mailbox.add_listener(self._wake_waiting)

    async def handle(self, info: Any, reader: Any, writer: Any) -> None:
        """Read messages from one stream until the sender ends it (a ``peers.wire.channels`` channel, or a
        single message); store each in the mailbox and acknowledge it. A peer over its cap of
        concurrent streams gets this one closed at once."""
        sender = str(info.peer_id.to_base58())
        if not await self._node.admitted.acheck(sender):  # the run's admission policy (peers.trust.admission)
            self.refusals.log(sender, -1, ProtocolError("not admitted to the run"))
            writer.close()
            return
        open_now = self.streams.get(sender, 0)
        if open_now >= self.max_streams_per_peer or sum(self.streams.values()) >= self.max_streams:
            self.refusals.log(sender, -1, ProtocolError(f"over {open_now} concurrent streams"))
            writer.close()
            return
        self.streams[sender] = open_now + 1
        reader = attach_frame_reader(reader, writer)  # frames land in their final buffer (one copy)
        try:
            while True:
                got = await read_header(reader, IDLE_CLOSE + 50.0)
                if got is None:
                    return  # the sender closed the stream after its last ack
                if not await self._handle_one(sender, got, reader, writer):
                    return
        except SwarmError as e:
            logger.debug("stream from %s ended: %s", sender[:16], e)
        except Exception:
            logger.debug("stream from %s broke", sender[:16], exc_info=True)
        finally:
            writer.close()
            self.streams[sender] -= 1
            if not self.streams[sender]:
                del self.streams[sender]

    async def _handle_one(
        self, sender: str, got: tuple[bytes, int, MessageClock], reader: Any, writer: Any
    ) -> bool:
        """One message; returns whether the stream is still in step (framing intact) to go on.

        Its bytes are reserved in the mailbox before its body is read; a refused body is drained
        (no allocation) when the sender may keep the stream, else the stream is closed after the ack.
        """
        body, nread, clock = got
        ok, err, in_step, body_read = True, "", True, False
        env: Envelope | None = None
        try:
            env = decode_envelope(body)
            if env.run != self.run_id:
                raise ProtocolError("message for another run")
            if env.type not in _MESSAGE_TYPES:
                raise ProtocolError(f"unexpected message type {env.type}")
            clock.expect(env.nbytes + 4 * env.frames)
            ticket = await self._admit(sender, env, reader, clock)
            if ticket is None:
                in_step = False
                raise ProtocolError("no room for the message before its round's group is known")
            try:
                frames, n = await read_data_frames(
                    reader, env, max_total=env.nbytes, timeout=0.0, clock=clock
                )
            except BaseException:
                self.mailbox.release(ticket)
                raise
            self.ledger.add_received(env.kind, env.round, nread + n)
            body_read = True
            self.mailbox.commit(ticket, Delivery(sender, env, tuple(frames)))
        except Refused as e:
            ok, err = False, str(e)
            in_step = e.keep_stream and (body_read or await self._drain(sender, env, reader, clock, nread))
        except SwarmError as e:
            ok, err, in_step = False, str(e), False
        if not ok:
            self.refusals.log(sender, -1 if env is None else env.round, err)
        n_ack = write_frame(writer, encode_ack(ok, err[:200]))
        try:
            await asyncio.wait_for(writer.drain(), _FRAME_TIMEOUT)  # a sender that stopped reading
        except asyncio.TimeoutError:
            raise PeerTimeoutError("the sender does not read its acks") from None
        if env is not None:
            self.ledger.add_sent(env.kind, env.round, n_ack)
        return in_step

    def drain_room(self, round_bytes: int) -> None:
        """What one sender may make this peer drain per minute: two rounds of ``round_bytes`` (a
        member's budget per round), and at least :data:`DRAIN_PER_MINUTE`."""
        self.drained.per_requester = float(max(DRAIN_PER_MINUTE, 2 * round_bytes))

    def _type_cap(self, env: Envelope) -> int:
        """The most bytes a message of this type may carry, whatever its round's budget says."""
        if env.type == "gather":  # an all-gather payload has its own setting
            return self.max_gather_bytes
        cap = _TYPE_CAPS.get(env.type, 1 << 40)
        return min(cap, self.max_message_bytes) if self.max_message_bytes is not None else cap

    async def _admit(self, sender: str, env: Envelope, reader: Any, clock: MessageClock) -> Ticket | None:
        """Reserve the message's bytes in the mailbox, waiting (at most :data:`_GROUP_WAIT` s) while
        its round's group is unknown and the pre-group allowance is full; ``None`` if it never fit.

        Raises:
            Refused: the mailbox refuses it (window, duplicate, non-member, quota, size).
        """
        if env.nbytes > self._type_cap(env):
            raise Refused(f"{env.type} message of {env.nbytes} bytes over its cap", keep_stream=False)
        end = time.monotonic() + _GROUP_WAIT
        waited = False
        while True:
            ticket = self.mailbox.reserve(sender, env)
            if ticket is not None:
                if waited:  # the time this peer made it wait does not count against the sender
                    clock.restart(getattr(reader, "received", 0))
                return ticket
            left = end - time.monotonic()
            if left <= 0:
                return None
            waited = True
            if self._room is None or self._room.done():
                self._room = asyncio.get_running_loop().create_future()
            await asyncio.wait([self._room], timeout=min(left, 1.0))

    def _wake_waiting(self) -> None:
        """Mailbox listener (any thread): wake the handlers waiting for room."""

        def wake() -> None:
            if self._room is not None and not self._room.done():
                self._room.set_result(None)

        try:
            self._node.loop.loop.call_soon_threadsafe(wake)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    async def _drain(
        self, sender: str, env: Envelope | None, reader: Any, clock: MessageClock, nread: int
    ) -> bool:
        """Read and discard a refused message's body so the stream stays in step; whether it did (not
        past the sender's :data:`DRAIN_PER_MINUTE`)."""
        if env is None or env.nbytes > self._type_cap(env) or not self.drained.take(sender, env.nbytes):
            return False
        try:
            n = await skip_data_frames(reader, env, clock)
        except SwarmError:
            return False
        self.ledger.add_received(env.kind, env.round, nread + n)
        return True
