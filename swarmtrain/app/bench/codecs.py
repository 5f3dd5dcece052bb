"""What a codec measurement needs to know about the machine: the last-level cache, and whether a
tensor of a given size sits in it (then throughputs measure the cache, not memory).

``swarmtrain bench codecs`` and ``examples/compare_compressors.py`` both use it: the default size is
the smallest that leaves the cache (twice the last-level cache in float32, capped at 64M elements),
and a smaller one, or a roofline fraction above 1, is named in one warning line.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "DEFAULT_LLC_BYTES",
    "MAX_DEFAULT_SIZE",
    "last_level_cache_bytes",
    "in_cache",
    "mark_above",
    "cache_warning",
    "default_size",
]

#: the last-level cache assumed where none can be read (a large desktop or server L3)
DEFAULT_LLC_BYTES = 32 << 20
_SYS_CPU = Path("/sys/devices/system/cpu")


def _parse_cache_size(text: str) -> int:
    """sysfs's ``32768K`` (or ``32M``, or plain bytes) -> bytes."""
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


def last_level_cache_bytes(device: str = "cpu", sys_cpu: Path = _SYS_CPU) -> int:
    """The last-level cache the benchmark's tensors could sit in, in bytes.

    CPU: every distinct highest-level cache in sysfs summed (a server with several L3 slices has
    them all); CUDA: the GPU's L2. :data:`DEFAULT_LLC_BYTES` where neither can be read.
    """
    if device.startswith("cuda"):
        import torch

        l2 = getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0)
        return int(l2) or DEFAULT_LLC_BYTES
    caches: dict[tuple[int, str], int] = {}  # (level, the cpus sharing it) -> size
    for index in sys_cpu.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            level = int((index / "level").read_text())
            shared = (index / "shared_cpu_list").read_text().strip()
            caches[(level, shared)] = _parse_cache_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
    if not caches:
        return DEFAULT_LLC_BYTES
    top = max(level for level, _ in caches)
    return sum(size for (level, _), size in caches.items() if level == top)


def in_cache(numel: int, llc_bytes: int) -> bool:
    """Whether a float32 tensor of ``numel`` elements stays (mostly) in a ``llc_bytes`` cache between
    repetitions: under twice its size, as the copy's source and destination then largely fit."""
    return 4 * numel < 2 * llc_bytes


def mark_above(numel: int, llc_bytes: int) -> float:
    """The roofline fraction above which a result is marked and named: any above 1 when the data
    sits in cache; from memory, beyond the few percent two timings of one copy differ by."""
    return 1.0 if in_cache(numel, llc_bytes) else 1.1


def cache_warning(numel: int, llc_bytes: int, marked: dict[str, float]) -> str | None:
    """One line when the results measure a cache rather than memory, else ``None``.

    A float32 tensor under twice the last-level cache stays (mostly) in it between repetitions, so
    codec and copy run at cache speed and fractions above 1 mean nothing about memory. ``marked``
    (codec -> fraction above :func:`mark_above`) is named either way: with a large tensor, a codec
    beat the copy timed beside it by more than timing noise.
    """
    mib = 1 << 20
    over = ", ".join(f"{codec} {frac:.2f}" for codec, frac in marked.items())
    if in_cache(numel, llc_bytes):
        return (
            f"warning: --size {numel:,} is {4 * numel / mib:.0f} MiB of float32, under twice the "
            f"{llc_bytes / mib:.0f} MiB last-level cache: the data stays in cache, so the roofline "
            f"fractions measure the cache, not memory"
            + (f" (above 1: {over})" if over else "")
            + f"; use --size {llc_bytes} (4x the cache in float32) or more"
        )
    if over:
        return (
            f"warning: roofline fractions above 1 beyond timing noise ({over}): faster than the copy "
            "timed beside them, so that copy ran slow; rerun on a quieter machine"
        )
    return None


#: the default size never grows past this (64M float32 elements), whatever the cache
MAX_DEFAULT_SIZE = 1 << 26


def default_size(llc_bytes: int) -> int:
    """The smallest power-of-two element count whose float32 tensor is out of a ``llc_bytes`` cache
    (:func:`in_cache` false), at least 4M and at most :data:`MAX_DEFAULT_SIZE`."""
    n = 1 << 22
    while in_cache(n, llc_bytes) and n < MAX_DEFAULT_SIZE:
        n *= 2
    return n
