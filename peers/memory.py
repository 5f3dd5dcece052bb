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
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

__all__ = ["retain_freed_buffers", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

logger = logging.getLogger(__name__)
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's upper limit for M_MMAP_THRESHOLD on 64-bit
TRIM_THRESHOLD = 1024 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_done: bool | None = None


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
