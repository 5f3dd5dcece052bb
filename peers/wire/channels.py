"""Persistent outgoing message channels: one P2P stream per destination peer, many messages on it.

Opening a libp2p stream through hivemind's daemon costs a unix-socket connection, a protobuf
handshake and a multistream negotiation on both sides; the butterfly all-reduce sends dozens of
messages per destination and round, so opening one stream per message dominated small chunks and made
2**18-element chunks ~2x slower. A :class:`Channel` keeps one stream to one peer open and writes the
queued messages back to back (header frame + data frames, exactly as :func:`peers.wire.transport.send_message`
would) without waiting for each ack; a reader task matches the receiver's one-frame acks to the
messages in order (FIFO). The receiver (``P2PCollective._handle``) reads messages until the stream ends.

Semantics per message are those of ``send_message``: the caller's future resolves once the receiver
acknowledged that message; a refusal raises ``ProtocolError``, a stream that breaks ``SwarmError`` and
a missing ack ``PeerTimeoutError`` by the message's deadline. Any failure closes the channel and fails
every message still in it (a broken stream cannot tell which of them arrived); the next message opens
a fresh stream. An idle channel closes its stream after :data:`IDLE_CLOSE` seconds, and the sender is
always the side that closes first, once every ack arrived, so no ack is ever cut off by a close.
Bytes are counted in the ledger where they hit the stream, per message kind and round.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from peers.wire.ledger import ByteLedger
from peers.wire.messages import FRAME_PREFIX, Envelope, Frame, decode_ack, encode_envelope
from peers.wire.transport import read_frame, widen_send_buffer, write_frame, write_frame_drained
from swarmtrain.core.errors import PeerTimeoutError, ProtocolError, SwarmError

__all__ = ["Channel", "ChannelPool", "IDLE_CLOSE", "lane_of"]

logger = logging.getLogger(__name__)
IDLE_CLOSE = 10.0  # seconds without messages after which a channel closes its stream
_OPEN_TIMEOUT = 15.0  # cap on opening one stream (the message deadline may be shorter)
_MAX_IDLE_KEPT = 256  # channels kept before idle ones (closed streams) are dropped


@dataclass
class _Item:
    env: Envelope
    frames: Sequence[Frame]
    deadline: float  # time.monotonic()
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Channel:
    """Messages to one peer over one stream; all methods run on the node's event loop.

    Args:
        p2p: hivemind ``P2P`` handle.
        peer_id: destination (``hivemind.p2p.PeerID``).
        handler: the destination's stream handler name.
        ledger: where bytes are counted (or ``None``).
    """

    def __init__(self, p2p: Any, peer_id: Any, handler: str, ledger: ByteLedger | None) -> None:
        self.p2p, self.peer_id, self.handler, self.ledger = p2p, peer_id, handler, ledger
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._pending: collections.deque[_Item] = collections.deque()  # written, not yet acked
        self._writer_task: asyncio.Task[None] | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._stream: tuple[Any, Any] | None = None  # (reader, writer)

    async def send(self, env: Envelope, frames: Sequence[Frame], deadline: float) -> None:
        """Queue one message and wait until the peer acknowledged it (or the deadline passed)."""
        if len(frames) != env.frames or sum(len(f) for f in frames) != env.nbytes:
            raise ProtocolError("envelope frame count/bytes do not match the frames")  # our own bug
        item = _Item(env, frames, deadline)
        self._queue.put_nowait(item)
        if self._writer_task is None or self._writer_task.done():
            self._writer_task = asyncio.create_task(self._write_loop())
        left = max(deadline - time.monotonic(), 0.05)
        try:
            await asyncio.wait_for(asyncio.shield(item.done), left)
        except asyncio.TimeoutError:
            err = PeerTimeoutError(f"peer {str(self.peer_id)[:16]} did not take {env.type} in {left:.1f} s")
            self._fail(err)  # a stuck stream: drop it with everything in it
            raise err from None

    def _fail(self, err: BaseException) -> None:
        """Close the stream and fail every queued or unacknowledged message with ``err``."""
        items = list(self._pending)
        self._pending.clear()
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        for it in items:
            if not it.done.done():
                it.done.set_exception(err)
                it.done.exception()  # mark retrieved: the sender may already have given up on it
        self._close_stream()
        for task in (self._writer_task, self._reader_task):
            if task is not None and task is not asyncio.current_task() and not task.done():
                task.cancel()
        self._writer_task = self._reader_task = None

    def _close_stream(self) -> None:
        if self._stream is not None:
            try:
                self._stream[1].close()
            except Exception:  # already broken
                logger.debug("closing a channel stream failed", exc_info=True)
            self._stream = None

    async def _open(self, deadline: float) -> tuple[Any, Any]:
        timeout = min(max(deadline - time.monotonic(), 0.05), _OPEN_TIMEOUT)
        try:
            _, reader, writer = await asyncio.wait_for(
                self.p2p.call_binary_stream_handler(self.peer_id, self.handler), timeout
            )
        except asyncio.TimeoutError:
            raise PeerTimeoutError(f"opening a stream to {str(self.peer_id)[:16]} timed out") from None
        except Exception as e:  # p2pd reports a dead or unknown peer with several error types
            raise SwarmError(
                f"cannot open a stream to {str(self.peer_id)[:16]}: {type(e).__name__}: {e}"
            ) from None
        widen_send_buffer(writer)
        self._stream = (reader, writer)
        self._reader_task = asyncio.create_task(self._read_acks(reader))
        return reader, writer

    async def _write_loop(self) -> None:
        try:
            while True:
                try:
                    item = await asyncio.wait_for(self._queue.get(), IDLE_CLOSE)
                except asyncio.TimeoutError:
                    if self._pending:
                        continue  # acks still outstanding: their own deadlines bound this
                    self._close_stream()  # idle: the sender closes first, after every ack
                    if self._reader_task is not None:
                        self._reader_task.cancel()
                        self._reader_task = None
                    self._writer_task = None
                    return
                if item.done.done():
                    continue  # its sender gave up already
                self._pending.append(item)  # from here on, a failure fails it with the rest
                _, writer = self._stream if self._stream is not None else await self._open(item.deadline)
                sent = write_frame(writer, encode_envelope(item.env))
                for f in item.frames:
                    sent += await write_frame_drained(writer, f)
                await writer.drain()
                if self.ledger is not None:
                    self.ledger.add_sent(item.env.kind, item.env.round, sent)
        except asyncio.CancelledError:
            raise
        except SwarmError as e:
            self._fail(e)
        except (ConnectionError, OSError, RuntimeError) as e:
            self._fail(SwarmError(f"stream to {str(self.peer_id)[:16]} broke: {e}"))

    async def _read_acks(self, reader: Any) -> None:
        try:
            while True:
                try:
                    ack = await read_frame(reader, 1024, IDLE_CLOSE + 60.0)
                except PeerTimeoutError:
                    if self._pending:
                        raise
                    continue  # idle; the writer closes the stream when it stays so
                if not self._pending:
                    raise ProtocolError("an ack for no message")
                item = self._pending.popleft()
                if self.ledger is not None:
                    self.ledger.add_received(item.env.kind, item.env.round, FRAME_PREFIX + len(ack))
                ok, err = decode_ack(ack)
                if item.done.done():
                    continue
                if ok:
                    item.done.set_result(None)
                else:
                    item.done.set_exception(
                        ProtocolError(f"peer {str(self.peer_id)[:16]} refused {item.env.type}: {err}")
                    )
        except asyncio.CancelledError:
            raise
        except SwarmError as e:  # the receiver closed the stream, or it broke
            self._fail(e)
        except (ConnectionError, OSError) as e:
            self._fail(SwarmError(f"stream to {str(self.peer_id)[:16]} broke: {e}"))

    @property
    def idle(self) -> bool:
        """No stream open and nothing queued or unacknowledged."""
        return self._stream is None and not self._pending and self._queue.empty()

    def close(self) -> None:
        """Drop the stream and fail what is still queued."""
        self._fail(SwarmError("channel closed"))


def lane_of(env: Envelope) -> str:
    """The channel a message travels on: aggregates get their own stream per peer, so an owner's
    aggregates never queue behind the parts it is still sending to the same peer (both directions of
    the butterfly flow at once, as in hivemind's averager where they share one bidirectional stream);
    small control messages get one too."""
    if env.type == "agg":
        return "agg"
    return "bulk" if env.frames and env.type != "grp" else "ctl"


class ChannelPool:
    """One :class:`Channel` per destination peer and lane (:func:`lane_of`), created on first use;
    event loop only."""

    def __init__(self, p2p: Any, handler: str, ledger: ByteLedger | None) -> None:
        self.p2p, self.handler, self.ledger = p2p, handler, ledger
        self._channels: dict[tuple[str, str], Channel] = {}

    async def send(self, peer: str, env: Envelope, frames: Sequence[Frame], deadline: float) -> None:
        """Send one message to ``peer`` on its channel; see :meth:`Channel.send`."""
        key = (peer, lane_of(env))
        ch = self._channels.get(key)
        if ch is None:
            from hivemind.p2p import PeerID

            if len(self._channels) >= _MAX_IDLE_KEPT:  # peers come and go: forget the idle ones
                for k in [k for k, c in self._channels.items() if c.idle]:
                    del self._channels[k]
            ch = self._channels[key] = Channel(self.p2p, PeerID.from_base58(peer), self.handler, self.ledger)
        await ch.send(env, frames, deadline)

    def close(self) -> None:
        """Close every channel."""
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
