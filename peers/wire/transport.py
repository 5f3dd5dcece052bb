"""Stream transport over hivemind's P2P: a background event loop and framed, counted message I/O.

hivemind's ``P2P`` is asyncio-based while trainers are synchronous, so each :class:`PeerNode` runs one
event loop in a daemon thread (:class:`LoopThread`) and the collectives submit coroutines to it with a
finite timeout. Messages are written with :func:`send_message` (header frame, data frames, then wait
for the receiver's ack) and read with :func:`read_frame`; both count every byte that crosses the
stream in the :class:`ByteLedger` (docs/architecture.md, Byte ledger: counted where the bytes hit the stream).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from peers.wire.framereader import FrameReader, MessageClock
from peers.wire.ledger import ByteLedger
from peers.wire.messages import (
    FRAME_PREFIX,
    MAX_FRAME,
    MAX_HEADER,
    Envelope,
    Frame,
    FrameParts,
    decode_ack,
    decode_frame_length,
    encode_envelope,
    encode_frame_length,
)
from swarmtrain.core.errors import PeerTimeoutError, ProtocolError, SwarmError

__all__ = [
    "LoopThread",
    "read_frame",
    "write_frame",
    "write_frame_drained",
    "widen_send_buffer",
    "SEND_BUFFER",
    "send_message",
    "read_envelope",
    "read_envelope_or_eof",
    "read_data_frames",
    "read_header",
    "skip_data_frames",
    "PART_BYTES",
    "split_bytes",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Bulk payloads are cut into parts of at most this many bytes before they go on a stream.
PART_BYTES = 4 * 1024 * 1024


class LoopThread:
    """An asyncio event loop running in a daemon thread; :meth:`run` submits a coroutine and waits."""

    def __init__(self, name: str = "swarmtrain-p2p") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; returns a thread-safe future."""
        if not self.loop.is_running() and self.loop.is_closed():
            coro.close()
            raise SwarmError("the peer's event loop is stopped")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run ``coro`` on the loop and wait at most ``timeout`` seconds.

        Raises:
            PeerTimeoutError: the coroutine did not finish in time (it is cancelled).
        """
        fut = self.submit(coro)
        try:
            return fut.result(timeout=max(timeout, 0.0))
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise PeerTimeoutError(f"operation did not finish within {timeout:.1f} s") from None

    def in_loop(self) -> bool:
        """True when called from the loop's own thread."""
        return threading.current_thread() is self._thread

    def stop(self, timeout: float = 5.0) -> None:
        """Cancel pending tasks, stop the loop and join its thread."""
        if self.loop.is_closed():
            return

        async def _cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(timeout)
            except Exception:  # best effort on shutdown
                logger.debug("cancelling loop tasks failed", exc_info=True)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


def split_bytes(data: bytes | memoryview, part: int = PART_BYTES) -> list[memoryview]:
    """Cut ``data`` into parts of at most ``part`` bytes (no copy); ``[]`` for empty data."""
    view = memoryview(data)
    return [view[i : i + part] for i in range(0, len(view), part)]


async def _readexactly(reader: Any, n: int, timeout: float, clock: MessageClock | None) -> Any:
    """``reader.readexactly(n)`` under ``clock`` (a :class:`FrameReader` checks its rate as it waits;
    any other reader gets the clock's whole-message deadline) or else a plain ``timeout``."""
    if clock is not None and isinstance(reader, FrameReader):
        return await reader.readexactly(n, clock)
    return await asyncio.wait_for(reader.readexactly(n), clock.left() if clock is not None else timeout)


async def read_frame(
    reader: asyncio.StreamReader, limit: int, timeout: float, clock: MessageClock | None = None
) -> bytes:
    """Read one length-prefixed frame of at most ``limit`` bytes within ``timeout`` seconds (or, with
    ``clock``, within its whole-message deadline and minimum rate).

    Raises:
        ProtocolError: oversized frame or the stream ended early.
        PeerTimeoutError: the peer was too slow.
    """
    try:
        prefix = await _readexactly(reader, FRAME_PREFIX, timeout, clock)
        n = decode_frame_length(prefix, limit)
        return await _readexactly(reader, n, timeout, clock) if n else b""  # type: ignore[no-any-return]
    except asyncio.IncompleteReadError:
        raise ProtocolError("stream closed in the middle of a frame") from None
    except asyncio.TimeoutError:
        raise PeerTimeoutError("peer too slow sending a frame") from None


def write_frame(writer: asyncio.StreamWriter, data: bytes | memoryview) -> int:
    """Queue one frame on ``writer``; returns the bytes it puts on the stream (prefix included)."""
    writer.write(encode_frame_length(len(data)))
    if len(data):
        writer.write(data)
    return FRAME_PREFIX + len(data)


WRITE_SLICE = 256 * 1024  # bytes handed to the transport at a time (see write_frame_drained)


async def write_frame_drained(writer: asyncio.StreamWriter, data: Frame) -> int:
    """Write one frame in slices of :data:`WRITE_SLICE` bytes, draining after each.

    asyncio's socket transport (3.11) keeps unsent bytes in one ``bytearray`` and deletes each sent
    prefix from its front, so handing it a multi-MiB frame at once costs a memmove of the remaining
    buffer per ``send()`` (quadratic in the frame size); slices keep that buffer small and send
    most bytes straight from our memory. A :class:`~peers.wire.messages.FrameParts` is written segment
    by segment under one prefix (its payload straight from pinned host memory, never joined).

    Returns:
        the bytes put on the stream (prefix included).
    """
    n = len(data)
    writer.write(encode_frame_length(n))
    for seg in data.parts if isinstance(data, FrameParts) else (data,):
        view = memoryview(seg).cast("B") if len(seg) else memoryview(b"")
        for i in range(0, len(view), WRITE_SLICE):
            writer.write(view[i : i + WRITE_SLICE])
            await writer.drain()
    return FRAME_PREFIX + n


SEND_BUFFER = 1024 * 1024  # SO_SNDBUF asked for on a bulk stream's socket to p2pd (Linux doubles it)


def widen_send_buffer(writer: Any) -> None:
    """Let the unix socket to our p2pd hold :data:`SEND_BUFFER` bytes instead of the ~208 KiB default.

    With the default, every 256 KiB slice fills the socket, the daemon is woken for each few dozen KiB
    and the two processes take turns; with a wider buffer a slice goes in one ``send`` and the daemon
    drains it in long runs, which costs less wall time and CPU per round (``benchmarks/allreduce.py``).
    Best effort: a socket that refuses keeps its default.
    """
    sock = writer.transport.get_extra_info("socket") if hasattr(writer, "transport") else None
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
    except OSError:
        logger.debug("could not widen a stream's send buffer", exc_info=True)


async def send_message(
    p2p: Any,
    peer_id: Any,
    handler: str,
    env: Envelope,
    frames: Sequence[Frame],
    *,
    ledger: ByteLedger | None,
    timeout: float,
) -> None:
    """Open a stream to ``peer_id``'s ``handler``, send a header and data frames, wait for the ack.

    Bytes are counted in ``ledger`` under ``(env.kind, env.round)`` as they are written/read.

    Raises:
        PeerTimeoutError: the peer did not take the message in ``timeout`` seconds.
        ProtocolError: the peer refused it (its ack says why) or answered garbage.
        SwarmError: the stream could not be opened (peer gone).
    """
    if len(frames) != env.frames or sum(len(f) for f in frames) != env.nbytes:
        raise ProtocolError("envelope frame count/bytes do not match the frames")  # our own bug
    header = encode_envelope(env)

    async def _go() -> None:
        try:
            _, reader, writer = await p2p.call_binary_stream_handler(peer_id, handler)
        except Exception as e:  # p2pd reports a dead or unknown peer with several error types
            raise SwarmError(
                f"cannot open a stream to {str(peer_id)[:16]}: {type(e).__name__}: {e}"
            ) from None
        widen_send_buffer(writer)
        try:
            sent = write_frame(writer, header)
            for f in frames:
                sent += await write_frame_drained(writer, f)
            await writer.drain()
            if ledger is not None:
                ledger.add_sent(env.kind, env.round, sent)
            ack = await read_frame(reader, 1024, timeout)
            if ledger is not None:
                ledger.add_received(env.kind, env.round, FRAME_PREFIX + len(ack))
            ok, err = decode_ack(ack)
            if not ok:
                raise ProtocolError(f"peer {str(peer_id)[:16]} refused {env.type}: {err}")
        except (ConnectionError, OSError) as e:
            raise SwarmError(f"stream to {str(peer_id)[:16]} broke: {e}") from None
        finally:
            writer.close()

    try:
        await asyncio.wait_for(_go(), timeout)
    except asyncio.TimeoutError:
        raise PeerTimeoutError(
            f"peer {str(peer_id)[:16]} did not take {env.type} in {timeout:.1f} s"
        ) from None


async def read_envelope(reader: asyncio.StreamReader, timeout: float) -> tuple[bytes, int]:
    """Read a header frame; returns ``(body, bytes_read)``."""
    body = await read_frame(reader, MAX_HEADER, timeout)
    return body, FRAME_PREFIX + len(body)


async def read_header(reader: Any, idle_timeout: float) -> tuple[bytes, int, MessageClock] | None:
    """The next message's header frame on a stream that may be idle: ``(body, bytes_read, clock)``,
    or ``None`` when the stream ends cleanly before a new message (a persistent channel closed by its
    sender; see ``peers.wire.channels``).

    The stream may stay idle up to ``idle_timeout`` seconds; from the message's first byte on, the
    returned :class:`MessageClock` runs (whole-message deadline, minimum rate): the header must be in
    within its grace period, and the caller adds the body's bytes with ``clock.expect``.
    """
    framed = isinstance(reader, FrameReader)
    if framed and not await reader.wait_data(idle_timeout):
        raise PeerTimeoutError("no message on an idle stream")
    clock = MessageClock(0, reader.received - reader.buffered if framed else 0)
    try:  # a plain reader cannot tell the first byte: its prefix gets the idle timeout
        prefix = await _readexactly(reader, FRAME_PREFIX, idle_timeout, clock if framed else None)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise ProtocolError("stream closed in the middle of a frame") from None
    except asyncio.TimeoutError:
        raise PeerTimeoutError("no message on an idle stream") from None
    n = decode_frame_length(prefix, MAX_HEADER)
    try:
        body = await _readexactly(reader, n, idle_timeout, clock) if n else b""
    except asyncio.IncompleteReadError:
        raise ProtocolError("stream closed in the middle of a frame") from None
    except asyncio.TimeoutError:
        raise PeerTimeoutError("peer too slow sending a frame") from None
    return bytes(body), FRAME_PREFIX + n, clock


async def read_envelope_or_eof(reader: asyncio.StreamReader, timeout: float) -> tuple[bytes, int] | None:
    """Like :func:`read_envelope`, but ``None`` when the stream ends cleanly before a new message
    (a persistent channel closed by its sender; see ``peers.wire.channels``)."""
    got = await read_header(reader, timeout)
    return None if got is None else (got[0], got[1])


async def read_data_frames(
    reader: asyncio.StreamReader,
    env: Envelope,
    *,
    max_total: int,
    timeout: float,
    clock: MessageClock | None = None,
) -> tuple[list[bytes], int]:
    """Read the ``env.frames`` data frames announced by ``env``; returns ``(frames, bytes_read)``.

    Each frame is allocated at its announced length, which is at most what is left of ``env.nbytes``:
    callers bound ``env.nbytes`` (and reserve it in a quota) before they call this.

    Raises:
        ProtocolError: the announced or actual total exceeds ``max_total`` or disagrees with ``env``.
        PeerTimeoutError: a frame took over ``timeout`` seconds, or ``clock`` ran out.
    """
    if env.nbytes > max_total:
        raise ProtocolError(f"message of {env.nbytes} bytes exceeds the {max_total}-byte cap")
    frames: list[bytes] = []
    total = 0
    for _ in range(env.frames):
        f = await read_frame(reader, min(MAX_FRAME, env.nbytes - total), timeout, clock)
        frames.append(f)
        total += len(f)
    if total != env.nbytes:
        raise ProtocolError("data frames do not add up to the announced size")
    return frames, total + FRAME_PREFIX * env.frames


async def skip_data_frames(reader: Any, env: Envelope, clock: MessageClock) -> int:
    """Read and discard the data frames of a refused message (at most ``env.nbytes`` bytes, through a
    small scratch buffer: nothing is allocated at the announced size); returns the bytes read.

    Raises:
        ProtocolError: frames that do not add up to ``env``, or the stream ended.
        PeerTimeoutError: ``clock`` ran out.
    """
    total = 0
    try:
        for _ in range(env.frames):
            n = decode_frame_length(await _readexactly(reader, FRAME_PREFIX, 0.0, clock), env.nbytes - total)
            if isinstance(reader, FrameReader):
                await reader.skip(n, clock)
            else:
                for i in range(0, n, 1 << 18):
                    await _readexactly(reader, min(1 << 18, n - i), 0.0, clock)
            total += n
    except asyncio.IncompleteReadError:
        raise ProtocolError("stream closed in the middle of a frame") from None
    except asyncio.TimeoutError:
        raise PeerTimeoutError("peer too slow sending a frame") from None
    if total != env.nbytes:
        raise ProtocolError("data frames do not add up to the announced size")
    return total + FRAME_PREFIX * env.frames
