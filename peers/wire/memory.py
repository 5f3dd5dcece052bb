"""Keep freed multi-MiB buffers in the heap, so a peer's rounds do not page-fault every buffer afresh.

Each all-reduce round allocates about three times the reduced tensor's bytes in buffers of a few MiB
(received frames, encoded parts, decoded chunks). glibc's allocator serves such sizes with ``mmap``
and returns them to the kernel on ``free`` (or trims the heap top), so every round touches fresh
pages: one page fault and one page clear per 4 KiB, on top of the round's own memory traffic.

:func:`retain_freed_buffers` raises glibc's mmap threshold to its 32 MiB maximum and its trim
threshold to 1 GiB for the calling process (``mallopt``), so those buffers come from the heap and are
reused round after round. The cost is that the process keeps its peak heap (a few times the largest
all-reduce) instead of giving it back between rounds. It does nothing off glibc, and it leaves a
process alone whose environment already sets ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``
(the operator's own choice) or sets ``SWARMTRAIN_KEEP_HEAP=0``.

The other side of that choice: memory a flood made the process allocate would stay in the heap after
the flood's data is dropped. :class:`HeapReturn` counts the bytes the collective drops from senders
that had no business sending them and, once they add up to :data:`FLOOD_TRIM_BYTES` (and at most once
per :data:`FLOOD_TRIM_INTERVAL` seconds), gives free heap pages back with glibc's ``malloc_trim(0)``
(:func:`release_heap`). Honest rounds never trigger it; after a flood the next round faults its
buffers in afresh once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
import time

__all__ = [
    "retain_freed_buffers",
    "release_heap",
    "HeapReturn",
    "MMAP_THRESHOLD",
    "TRIM_THRESHOLD",
    "FLOOD_TRIM_BYTES",
    "FLOOD_TRIM_INTERVAL",
]

logger = logging.getLogger(__name__)
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's upper limit for M_MMAP_THRESHOLD on 64-bit
TRIM_THRESHOLD = 1024 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_done: bool | None = None
FLOOD_TRIM_BYTES = 16 * 1024 * 1024  # dropped bytes that make a flood worth a heap trim
FLOOD_TRIM_INTERVAL = 5.0  # seconds between two trims at most


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def retain_freed_buffers() -> bool:
    """Tune glibc's allocator for this process once (see the module docstring).

    Returns:
        whether the tuning is in effect.
    """
    global _done
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("SWARMTRAIN_KEEP_HEAP", "1") == "0" or any(
        k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    ):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap_ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    _done = mmap_ok and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not _done:
        logger.debug("mallopt refused the heap settings")
    return _done


def release_heap() -> bool:
    """Give the free pages of every malloc arena back to the kernel now (glibc ``malloc_trim(0)``).

    Returns:
        whether glibc released any memory (``False`` off glibc).
    """
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


class HeapReturn:
    """Trim the heap once a flood's dropped bytes add up (see the module docstring); thread-safe.

    Args:
        threshold: dropped bytes that trigger a trim.
        min_interval: seconds between two trims at least.
    """

    def __init__(self, threshold: int = FLOOD_TRIM_BYTES, min_interval: float = FLOOD_TRIM_INTERVAL) -> None:
        self.threshold, self.min_interval = threshold, min_interval
        self._pending = 0
        self._last = -float("inf")
        self._lock = threading.Lock()
        #: how many trims ran (diagnostics)
        self.trims = 0

    def dropped(self, nbytes: int) -> None:
        """Count ``nbytes`` of flood data that were let go (call from any thread)."""
        with self._lock:
            self._pending += max(nbytes, 0)

    def maybe_trim(self) -> bool:
        """Trim now if enough flood data was dropped since the last trim; call off the event loop.

        Returns:
            whether a trim ran.
        """
        with self._lock:
            now = time.monotonic()
            if self._pending < self.threshold or now - self._last < self.min_interval:
                return False
            self._pending, self._last = 0, now
            self.trims += 1
        release_heap()
        return True
