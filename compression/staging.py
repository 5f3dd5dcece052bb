"""Device staging of codec packets: quantise on the GPU, copy the payload into reused pinned host memory.

A CUDA tensor is quantised on its device by the codec's own kernels (``device_parts``: the same
ops as the plain path, so the bytes are identical to a CPU encode of the same input), then the payload
(codes, scales, and the largest block absmax that the finite check needs) is copied with
``non_blocking=True`` on a side stream into one pinned buffer from a :class:`PinnedPool`. An event
marks the copy's end; a :class:`StagedPacket` hands out memoryviews of the buffer only after it.
The finite check runs on the host after the event, so an encode costs no device synchronisation.

``compress_many`` keeps ``depth`` chunks in flight: chunk ``k + 1`` is quantised on the compute
stream while chunk ``k``'s payload crosses the bus, and the caller sends chunk ``k - 1`` meanwhile.
``StagedPacket.wire_parts`` gives the packet's wire bytes as segments (a small msgpack head and
memoryviews of the pinned buffer), which ``peers.wire.messages.FrameParts`` sends without joining them.

Decoding goes the same way back: :func:`to_device` copies a peer's bytes into a pinned buffer and
from there to the device with ``non_blocking=True`` (the buffer returns to the pool with an event).

CPU tensors keep the plain path untouched (native kernels, ``bytes``); other devices (an emulated
accelerator in the tests) use the plain path's ``.cpu()`` copies and never call CUDA.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from compression.base import check_absmax_top
from swarmtrain.core.packet import Packet, ParamValue
from swarmtrain.core.protocols import Compressor
from swarmtrain.core.wire import encode_packet_parts

__all__ = [
    "DeviceParts",
    "DeviceStaging",
    "PinnedPool",
    "StagedPacket",
    "default_pool",
    "stage",
    "compress_many",
    "to_device",
    "stages",
    "compress_packet",
]

_MIN_BUCKET = 1 << 16


@dataclass(frozen=True)
class DeviceParts:
    """A packet whose payload still lives in tensors on the encoding device.

    Attributes:
        buffers: per wire buffer, the tensors whose raw bytes, concatenated, make it.
        top: 0-d float32 largest block absmax (NaN if the input held one); None when empty.
    """

    codec: str
    shape: tuple[int, ...]
    dtype: str
    params: tuple[tuple[str, ParamValue], ...]
    buffers: tuple[tuple[torch.Tensor, ...], ...]
    top: torch.Tensor | None


def _bucket(nbytes: int) -> int:
    """Capacity of the buffer serving ``nbytes``: the next power of two, at least 64 KiB."""
    return max(_MIN_BUCKET, 1 << max(nbytes - 1, 0).bit_length())


class PinnedPool:
    """Host buffers (pinned when CUDA is there) reused across calls, keyed by power-of-two capacity.

    ``acquire`` returns an idle buffer of the right bucket (waiting for the event it came back with)
    or allocates one; ``release`` returns it. Idle buffers are bounded by ``max_idle_bytes`` in all
    and ``per_bucket`` per capacity; a buffer over either bound is dropped (freed by torch).

    Args:
        pin: allocate pinned memory (default: whether CUDA is available).
    """

    def __init__(self, max_idle_bytes: int = 1 << 30, per_bucket: int = 64, pin: bool | None = None) -> None:
        self.max_idle_bytes = int(max_idle_bytes)
        self.per_bucket = int(per_bucket)
        self.pin = torch.cuda.is_available() if pin is None else bool(pin)
        self._idle: dict[int, deque[tuple[torch.Tensor, Any]]] = {}
        self._idle_bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = self.dropped = 0

    @property
    def idle_bytes(self) -> int:
        """Bytes held by idle buffers."""
        return self._idle_bytes

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A uint8 host buffer of at least ``nbytes`` bytes that nothing else uses."""
        cap = _bucket(nbytes)
        with self._lock:
            q = self._idle.get(cap)
            item = q.popleft() if q else None
            if item is not None:
                self._idle_bytes -= cap
                self.hits += 1
            else:
                self.misses += 1
        if item is None:
            return torch.empty(cap, dtype=torch.uint8, pin_memory=self.pin)
        buf, event = item
        if event is not None:
            event.synchronize()  # the last copy from/into it is done
        return buf

    def release(self, buf: torch.Tensor, event: Any = None) -> None:
        """Return ``buf``; ``event`` (a CUDA event or None) marks the end of its last pending copy."""
        cap = buf.numel()
        with self._lock:
            q = self._idle.setdefault(cap, deque())
            if len(q) >= self.per_bucket or self._idle_bytes + cap > self.max_idle_bytes:
                self.dropped += 1
                return
            q.append((buf, event))
            self._idle_bytes += cap

    def clear(self) -> None:
        """Drop every idle buffer."""
        with self._lock:
            self._idle.clear()
            self._idle_bytes = 0


_POOL: PinnedPool | None = None
_POOL_LOCK = threading.Lock()
_STREAMS: dict[int, Any] = {}


def default_pool() -> PinnedPool:
    """The process's pool (created on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = PinnedPool()
        return _POOL


def _side_stream(device: torch.device) -> Any:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    with _POOL_LOCK:
        s = _STREAMS.get(idx)
        if s is None:
            s = _STREAMS[idx] = torch.cuda.Stream(device=idx)
        return s


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t`` as a flat contiguous uint8 tensor (a view when ``t`` is contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class StagedPacket:
    """A packet whose payload is (being) copied into a pooled host buffer.

    Call :meth:`wait` (``compress_many`` does) before reading :attr:`buffers`; call :meth:`release`
    once nothing reads them any more (the sends settled) so the buffer serves the next round.
    """

    def __init__(
        self,
        parts: DeviceParts | Packet,
        views: Sequence[memoryview | bytes] = (),
        lease: torch.Tensor | None = None,
        event: Any = None,
        pool: PinnedPool | None = None,
    ) -> None:
        self.codec, self.shape, self.dtype, self.params = parts.codec, parts.shape, parts.dtype, parts.params
        if isinstance(parts, Packet):
            self._views: tuple[memoryview | bytes, ...] = parts.buffers
            self._top: memoryview | None = None
        else:
            self._views = tuple(views[: len(parts.buffers)])
            self._top = memoryview(views[-1]) if parts.top is not None else None
        self._lease, self._event, self._pool = lease, event, pool
        self._ready = self._lease is None

    @property
    def buffers(self) -> tuple[memoryview | bytes, ...]:
        """The payload buffers (memoryviews of the pooled buffer when staged)."""
        self.wait()
        return self._views

    def wait(self) -> None:
        """Wait for the copy; raise ``UpdateRejected`` (and release) if the input was not finite."""
        if self._ready:
            return
        if self._event is not None:
            self._event.synchronize()
        self._ready = True
        if self._top is not None:
            top = float(np.frombuffer(self._top, dtype="<f4")[0])
            try:
                check_absmax_top(top, self.dtype, self.codec)
            except Exception:
                self.release()
                raise

    def packet(self) -> Packet:
        """A plain ``Packet`` (the payload copied into ``bytes``)."""
        bufs = tuple(b if isinstance(b, bytes) else bytes(b) for b in self.buffers)
        return Packet(self.codec, self.shape, self.dtype, bufs, self.params)

    def wire_parts(self) -> list[bytes | memoryview]:
        """Segments whose concatenation is ``encode_packet(self.packet())``, without joining them."""
        return encode_packet_parts(self.codec, self.dtype, self.shape, self.params, self.buffers)

    def release(self) -> None:
        """Return the pooled buffer (the memoryviews must not be read afterwards)."""
        lease, self._lease = self._lease, None
        if lease is not None and self._pool is not None:
            self._pool.release(lease, self._event if not self._ready else None)

    @property
    def nbytes(self) -> int:
        """Payload bytes."""
        return sum(len(b) for b in self._views)


@runtime_checkable
class DeviceStaging(Protocol):
    """A codec that quantises on the tensor's device and leaves the payload there (blockwise, ternary)."""

    def device_parts(self, t: torch.Tensor, *, key: str = "") -> DeviceParts:
        """The packet of ``t`` with its payload still in tensors on ``t``'s device."""
        ...


def stages(codec: Compressor, t: torch.Tensor) -> bool:
    """Whether ``compress_many`` stages ``t`` through the device path (a CUDA tensor, a staging codec)."""
    return bool(t.is_cuda) and isinstance(codec, DeviceStaging)


def _copy_jobs(parts: DeviceParts) -> tuple[list[tuple[torch.Tensor, int]], list[tuple[int, int]], int]:
    """Raw sources with their offsets in the buffer, each wire buffer's span, and the total bytes."""
    jobs: list[tuple[torch.Tensor, int]] = []
    spans: list[tuple[int, int]] = []
    off = 0
    for group in parts.buffers:
        start = off
        for t in group:
            if t.numel():
                raw = _raw(t)
                jobs.append((raw, off))
                off += raw.numel()
        spans.append((start, off))
    if parts.top is not None:
        raw = _raw(parts.top.reshape(1).float())
        jobs.append((raw, off))
        spans.append((off, off + 4))
        off += 4
    return jobs, spans, off


def _copy_async(lease: torch.Tensor, jobs: list[tuple[torch.Tensor, int]], device: torch.device) -> Any:
    """Queue the device-to-host copies on the side stream after the work queued so far; an event."""
    side = _side_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for raw, off in jobs:
            lease[off : off + raw.numel()].copy_(raw, non_blocking=True)
            raw.record_stream(side)  # the allocator keeps it until the copy has read it
        event = torch.cuda.Event()
        event.record(side)
    return event


def stage(
    codec: DeviceStaging, t: torch.Tensor, *, key: str = "", pool: PinnedPool | None = None
) -> StagedPacket:
    """Encode ``t`` with ``codec.device_parts`` and start the copy of its payload into a pooled buffer.

    On CUDA the copy is asynchronous (see the module docstring); on the CPU (tests) it is a plain copy.
    """
    parts: DeviceParts = codec.device_parts(t, key=key)
    pool = pool if pool is not None else default_pool()
    jobs, spans, total = _copy_jobs(parts)
    lease = pool.acquire(total)
    event = None
    if t.is_cuda:
        event = _copy_async(lease, jobs, t.device)
    else:
        for raw, off in jobs:
            lease[off : off + raw.numel()].copy_(raw.cpu())
    mv = lease.numpy().data.cast("B")
    return StagedPacket(parts, [mv[a:b] for a, b in spans], lease, event, pool)


def compress_many(
    codec: Compressor,
    items: Iterable[tuple[torch.Tensor, str]],
    *,
    depth: int = 2,
    pool: PinnedPool | None = None,
) -> Iterator[StagedPacket]:
    """Compress ``(tensor, key)`` items in order, yielding each as a ready ``StagedPacket``.

    CUDA tensors of a staging codec are staged with ``depth`` items in flight (chunk ``k + 1``'s
    device encode overlaps chunk ``k``'s copy to the host); anything else is ``codec.compress`` as
    before, wrapped. The caller releases each yielded packet once its sends settled.
    """
    window: deque[StagedPacket] = deque()
    for t, key in items:
        if t.is_cuda and isinstance(codec, DeviceStaging):
            window.append(stage(codec, t, key=key, pool=pool))
        else:
            window.append(StagedPacket(codec.compress(t, key=key)))
        if len(window) >= max(1, depth):
            ready = window.popleft()
            ready.wait()
            yield ready
    while window:
        ready = window.popleft()
        ready.wait()
        yield ready


def compress_packet(codec: DeviceStaging, t: torch.Tensor, key: str = "") -> Packet:
    """``codec.compress`` of a CUDA tensor through the staging path (a ``bytes`` packet)."""
    s = stage(codec, t, key=key)
    try:
        return s.packet()
    finally:
        s.release()


def to_device(src: torch.Tensor, device: torch.device, pool: PinnedPool | None = None) -> torch.Tensor:
    """``src`` (a CPU tensor, e.g. a view of a peer's bytes) on ``device``.

    On CUDA through a pooled pinned buffer and a ``non_blocking`` copy on the current stream (the
    buffer returns to the pool with an event marking the copy's end); elsewhere ``src.to(device)``.
    """
    if device.type != "cuda" or src.numel() == 0:
        return src.to(device)
    pool = pool if pool is not None else default_pool()
    n = src.numel() * src.element_size()
    lease = pool.acquire(n)
    lease[:n].copy_(_raw(src))
    out = lease[:n].view(src.dtype).reshape(src.shape).to(device, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(out.device))
    pool.release(lease, event)
    return out
