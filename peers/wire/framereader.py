"""Receive bulk frames straight into their final buffer: an ``asyncio.BufferedProtocol`` reader.

asyncio's ``StreamReader`` receives into a fresh 256 KiB ``bytes`` per ``recv``, appends it to its own
``bytearray``, pauses and resumes the socket every 128 KiB (its default limit) and copies the frame
out again on ``readexactly``: three copies of every byte and two ``epoll_ctl`` calls per 128 KiB.
Profiling the all-reduce's receiving event loop showed those steps at about a third of its CPU time.

:class:`FrameReader` takes over the stream's transport once hivemind has read its handshake
(``transport.set_protocol``): ``readexactly(n)`` allocates the ``n``-byte ``bytearray`` the frame ends
up in and lets the socket ``recv_into`` it directly (one copy, by the kernel). Bytes that arrive
between reads go to a bounded side buffer (reading pauses above :data:`MAX_AHEAD` bytes). It offers the
``readexactly`` coroutine of ``StreamReader``, with the same ``IncompleteReadError`` at end of stream,
so ``peers.wire.transport``'s framing functions work on either. :func:`attach` falls back to the plain
``StreamReader`` if the transport or reader is not the kind it knows (it uses the stream reader's
internal buffer to take over the bytes it already holds).

Slow senders: a :class:`MessageClock` passed to :meth:`FrameReader.readexactly` (or :meth:`skip`)
bounds one whole message: it must be complete by ``start + grace + nbytes / min_rate`` and, after the
grace period, have arrived at :data:`MIN_RATE` bytes per second at least, checked every second while
the reader waits; a sender that trickles is cut off with ``PeerTimeoutError`` instead of holding the
stream for a timeout per frame.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from swarmtrain.core.errors import PeerTimeoutError

__all__ = ["FrameReader", "MessageClock", "attach", "MAX_AHEAD", "MIN_RATE", "GRACE"]

logger = logging.getLogger(__name__)
MAX_AHEAD = 4 * 1024 * 1024  # bytes buffered ahead of the reader before the socket is paused
_SCRATCH = 256 * 1024
#: bytes per second a message must average once its grace period is over (0.5 Mbit/s: far below a
#: 20 Mbit/s WAN link shared by a few streams, far above a trickle)
MIN_RATE = 64 * 1024
GRACE = 10.0  # seconds every message gets before the minimum rate applies


class MessageClock:
    """The whole-message deadline and minimum rate of one incoming message.

    Args:
        nbytes: bytes the message is expected to carry (more may be announced with :meth:`expect`).
        received: the stream's byte count (``FrameReader.received``) when the message started.
        grace: seconds before the minimum rate applies.
        min_rate: bytes per second the message must average after the grace period.
    """

    def __init__(
        self, nbytes: int, received: int = 0, *, grace: float = GRACE, min_rate: float = MIN_RATE
    ) -> None:
        self.grace, self.min_rate = grace, float(min_rate)
        self.nbytes = 0
        self.restart(received)
        self.expect(nbytes)

    def restart(self, received: int) -> None:
        """Start the clock now (e.g. after the receiver itself made the sender wait)."""
        self.start, self.base = time.monotonic(), received

    def expect(self, nbytes: int) -> None:
        """The message carries ``nbytes`` more bytes (its body, once the header announced it)."""
        self.nbytes += nbytes

    @property
    def deadline(self) -> float:
        """``time.monotonic()`` by which the whole message must be in."""
        return self.start + self.grace + self.nbytes / self.min_rate

    def left(self) -> float:
        """Seconds until the deadline (``> 0``; at least a little, so a caller's ``wait_for`` runs)."""
        return max(self.deadline - time.monotonic(), 0.01)

    def check(self, received: int) -> float:
        """Raise if the message is late or too slow; otherwise the seconds until the next check.

        Raises:
            PeerTimeoutError: past the whole-message deadline, or below the minimum rate.
        """
        now = time.monotonic()
        if now >= self.deadline:
            raise PeerTimeoutError(
                f"message not complete within its {self.deadline - self.start:.0f} s deadline"
            )
        if received - self.base < self.min_rate * (now - self.start - self.grace):
            raise PeerTimeoutError(f"sender below the minimum rate of {self.min_rate / 1024:.0f} KiB/s")
        return min(self.deadline - now, 1.0)


class FrameReader(asyncio.BufferedProtocol):
    """A ``BufferedProtocol`` with a ``StreamReader``-like ``readexactly`` (one reader at a time)."""

    def __init__(self, transport: Any, pending: bytes | bytearray, eof: bool) -> None:
        self._transport = transport
        self._ahead = bytearray(pending)  # received, not yet consumed
        self._scratch = bytearray(_SCRATCH)
        self._target: memoryview | None = None  # the frame being filled by recv_into
        self._pos = 0
        self._waiter: asyncio.Future[None] | None = None
        self._eof = eof
        self._paused = False
        #: bytes received on the stream so far (for the minimum-rate check)
        self.received = len(self._ahead)
        self._skip: bytearray | None = None
        self._into_target = False  # the last get_buffer() handed out the target, not the scratch

    # --- protocol side (called by the transport) ---------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        # a full target may still be set for a loop iteration before its reader resumes
        self._into_target = self._target is not None and self._pos < len(self._target)
        if self._into_target:
            return self._target[self._pos :]  # type: ignore[index]
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        self.received += nbytes
        if self._into_target and self._target is not None:
            self._pos += nbytes
            if self._pos == len(self._target):
                self._wake()
            return
        self._ahead += self._scratch[:nbytes]
        self._wake()  # a wait_data() caller
        if len(self._ahead) > MAX_AHEAD and not self._paused:
            self._transport.pause_reading()
            self._paused = True

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # let the transport close its side

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # --- reader side ------------------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Bytes received and not yet read."""
        return len(self._ahead)

    async def wait_data(self, timeout: float) -> bool:
        """Wait until at least one unread byte is here or the stream ended; ``False`` on timeout."""
        if self._ahead or self._eof:
            return True
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait([self._waiter], timeout=timeout)
        finally:
            self._waiter = None
        return bool(self._ahead) or self._eof

    async def readexactly(self, n: int, clock: MessageClock | None = None) -> bytearray:
        """Exactly ``n`` bytes; ``asyncio.IncompleteReadError`` if the stream ends first,
        ``PeerTimeoutError`` if ``clock`` runs out while waiting."""
        buf = bytearray(n)
        got = await self._fill(memoryview(buf), clock)
        if got < n:
            raise asyncio.IncompleteReadError(bytes(buf[:got]), n)
        return buf

    async def skip(self, n: int, clock: MessageClock | None = None) -> None:
        """Consume ``n`` bytes without keeping them (a refused body, drained through one small
        scratch buffer so the stream stays in step)."""
        if self._skip is None:
            self._skip = bytearray(_SCRATCH)
        view = memoryview(self._skip)
        while n > 0:
            k = min(n, len(view))
            if await self._fill(view[:k], clock) < k:
                raise asyncio.IncompleteReadError(b"", n)
            n -= k

    async def _fill(self, view: memoryview, clock: MessageClock | None) -> int:
        """Fill ``view`` from the side buffer, then straight from the socket; returns the bytes got."""
        n = len(view)
        take = min(n, len(self._ahead))
        if take:
            view[:take] = self._ahead[:take]
            del self._ahead[:take]
        if self._paused and len(self._ahead) <= MAX_AHEAD // 2:
            self._paused = False
            self._transport.resume_reading()
        if take == n or self._eof:
            return take
        self._target, self._pos = view, take
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        if self._paused:
            self._paused = False
            self._transport.resume_reading()
        try:
            if clock is None:
                await waiter
            while not waiter.done():  # clock is set
                await asyncio.wait([waiter], timeout=clock.check(self.received))  # type: ignore[union-attr]
        finally:
            got, self._target, self._waiter = self._pos, None, None
        return got


def attach(reader: Any, writer: Any) -> Any:
    """A :class:`FrameReader` that takes over ``writer``'s transport, or ``reader`` itself if the
    transport cannot switch to a buffered protocol."""
    transport = getattr(writer, "transport", None)
    pending = getattr(reader, "_buffer", None)
    if (
        transport is None
        or not isinstance(pending, bytearray)
        or not isinstance(reader, asyncio.StreamReader)
        or not hasattr(transport, "set_protocol")
        or transport.is_closing()
    ):
        return reader
    try:
        fr = FrameReader(transport, bytes(pending), bool(getattr(reader, "_eof", False)))
        transport.set_protocol(fr)
        pending.clear()
        if not transport.is_reading():  # the stream reader may have paused it
            transport.resume_reading()
    except Exception:  # an unknown transport: keep the stream reader
        logger.debug("could not attach a frame reader", exc_info=True)
        return reader
    return fr
