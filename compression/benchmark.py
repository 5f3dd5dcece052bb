"""Codec throughput against the memory roofline, measured in one run on one machine.

For each codec: compress and decompress time of one large float32 tensor (best of ``reps`` after a
warm-up call that also triggers any ``torch.compile``), the relative L2 error and the payload bits
per element. The roofline is a plain ``copy_`` of the same tensor measured in the same run: the
fraction reported for a codec is (bytes it must read + write) per second divided by the copy's
(read + write) bytes per second. Compress must read ``4n`` bytes and write its payload; decompress
reads the payload and writes ``4n``.

Two allocator regimes are measured in the same run. *Fresh*: the default glibc allocator, which
serves every large output (codes tensor, packet ``bytes``) from a new ``mmap`` whose pages the
kernel faults in and zeroes on first touch. *Steady state* (``steady_state=True``): after
``keep_freed_memory()``, outputs reuse the pages freed by the previous round, as a long-running
peer that compresses the same tensors every round does. The headline fields are the steady-state
ones when measured; the ``fresh_*`` fields always hold the fresh-allocation figures.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from compression.base import CODECS
from compression.factory import codec_names, make_codec
from compression.kernels import compile_mode, min_numel
from compression.native import available as native_available
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.registry import NamesView

__all__ = [
    "CodecResult",
    "benchmark_codecs",
    "environment",
    "report",
    "format_table",
    "table_rows",
    "TABLE_HEADER",
    "FRESH_HEADER",
    "DEFAULT_CODECS",
    "keep_freed_memory",
]


def _default_codecs() -> list[str]:
    """Every registered codec (registration order; plugins included) but bare ``topk``, then ``topk+int8``."""
    names = [n for n in CODECS.in_order() if n != "topk"]
    return [*names, "topk+int8"] if "topk+int8" in CODECS.wire_names() else names


#: the codecs measured by default: derived from the registry on each use, so a new codec (or a
#: plugin's) is measured without editing a list here.
DEFAULT_CODECS: NamesView = NamesView(_default_codecs, ordered=True)


@dataclass(frozen=True)
class CodecResult:
    """One codec's measured figures (GB are 1e9 bytes; "of input" means float32 input bytes)."""

    codec: str
    numel: int
    bits_per_element: float
    rel_l2_error: float
    compress_s: float
    decompress_s: float
    compress_gbps: float
    decompress_gbps: float
    compress_roofline: float
    decompress_roofline: float
    copy_rw_gbps: float
    compiled: bool
    steady_state: bool = False
    #: how the encoder ran: "native" (compression.native C kernel), "compiled", "eager" or "torch"
    encoder: str = "torch"
    fresh_compress_gbps: float = 0.0
    fresh_decompress_gbps: float = 0.0
    fresh_compress_roofline: float = 0.0
    fresh_decompress_roofline: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def keep_freed_memory() -> bool:
    """Ask glibc to serve large allocations from its heap and keep freed memory (benchmarks only).

    By default every large tensor or ``bytes`` object is a fresh ``mmap`` whose pages the kernel
    must fault in and zero on first touch, which on small machines costs as much as the codec's own
    memory traffic. Setting ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` high lets repeated calls reuse
    warm pages, which isolates the codec's own cost. Returns whether both settings were accepted.
    Process-wide: the library never calls this itself.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, 1 << 30)) and bool(libc.mallopt(-1, 1 << 31))  # M_MMAP_, M_TRIM_
    except (OSError, AttributeError):
        return False


def _compiled_path(numel: int) -> bool:
    mode = compile_mode()
    return mode == "always" or (mode == "auto" and numel >= min_numel())


_QUANTISERS = ("int8", "int4", "ternary")


def _encoder_path(name: str, x: torch.Tensor) -> str:
    if name not in _QUANTISERS:
        return "torch"
    if x.device.type == "cpu" and x.dtype == torch.float32 and native_available():
        return "native"
    return "compiled" if _compiled_path(x.numel()) else "eager"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn: Callable[[], object], reps: int, device: torch.device) -> float:
    best = float("inf")
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _time_interleaved(
    codec: Any, x: torch.Tensor, p: Any, y: torch.Tensor, reps: int, dev: torch.device
) -> tuple[float, float, float]:
    """Best-of-``reps`` seconds of (compress, decompress, copy), one of each per repetition in turn.

    Interleaving puts the copy that defines the roofline under the same background load as the
    codec it is compared with (the machines these run on are shared).
    """
    tc = td = tk = float("inf")
    for _ in range(reps):
        tk = min(tk, _best(lambda: y.copy_(x), 1, dev))
        tc = min(tc, _best(lambda: codec.compress(x, key="bench"), 1, dev))
        td = min(td, _best(lambda: codec.decompress(p), 1, dev))
    tk = min(tk, _best(lambda: y.copy_(x), 1, dev))
    return tc, td, tk


def benchmark_codecs(
    numel: int = 1 << 26,
    codecs: Iterable[str] = DEFAULT_CODECS,
    *,
    reps: int = 3,
    device: str | torch.device = "cpu",
    block: int = 256,
    topk_fraction: float = 0.01,
    seed: int = 0,
    steady_state: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[CodecResult]:
    """Measure every codec in ``codecs`` on one standard-normal float32 tensor of ``numel`` elements.

    Every codec is first timed with the allocator as it is (fresh pages for large outputs). With
    ``steady_state`` the function then calls ``keep_freed_memory()`` (process-wide, for benchmark
    processes only) and times every codec again with reused pages; those become the headline figures.
    The copy that defines the roofline is timed interleaved with each codec's own repetitions (one
    copy, one compress, one decompress per repetition; best of each), so a codec and its roofline
    see the same background load on a shared machine; ``copy_rw_gbps`` of each result is that copy.
    """
    codecs = list(codecs)  # a live default is read once
    for name in codecs:
        if name not in codec_names():
            raise ConfigError(f"unknown codec {name!r}; choose from {', '.join(codec_names())}")
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=gen).to(dev)
    dst = torch.empty_like(x)  # the copy's destination, warm like a reused buffer
    dst.copy_(x)
    made: dict[str, tuple[Any, Any, float]] = {}
    fresh: dict[str, tuple[float, float, float]] = {}
    steady: dict[str, tuple[float, float, float]] = {}
    for name in codecs:
        codec = make_codec(name, block=block, fraction=topk_fraction, seed=seed, device=dev)
        if progress is not None:
            progress(f"{name}: warming up")
        made[name] = _warm_up(codec, x)
        fresh[name] = _time_interleaved(codec, x, made[name][1], dst, reps, dev)
        _progress(progress, f"{name} (fresh pages)", fresh[name], x)
    if steady_state and keep_freed_memory():
        for name in codecs:
            codec, p, _ = made[name]
            codec.decompress(codec.compress(x, key="bench"))  # untimed: fills the reusable heap
            steady[name] = _time_interleaved(codec, x, p, dst, reps, dev)
            _progress(progress, f"{name} (steady state)", steady[name], x)
    return [_result(name, x, made[name], fresh[name], steady.get(name)) for name in codecs]


def _warm_up(codec: Any, x: torch.Tensor) -> tuple[Any, Any, float]:
    """``(codec, packet, relative L2 error)`` after one untimed round trip (compiles once when enabled)."""
    p = codec.compress(x, key="bench")
    y = codec.decompress(p)
    return codec, p, float((y.float() - x).norm() / x.norm())


def _progress(
    progress: Callable[[str], None] | None, label: str, times: tuple[float, float, float], x: torch.Tensor
) -> None:
    if progress is not None:
        tc, td, _ = times
        in_bytes = 4 * x.numel()
        progress(
            f"{label}: compress {in_bytes / tc / 1e9:.2f} GB/s, decompress {in_bytes / td / 1e9:.2f} GB/s"
        )


def _result(
    name: str,
    x: torch.Tensor,
    made: tuple[Any, Any, float],
    fresh: tuple[float, float, float],
    steady: tuple[float, float, float] | None,
) -> CodecResult:
    """One codec's figures: the steady-state timings as headline when measured, else the fresh ones."""
    _, p, err = made
    numel = x.numel()
    in_bytes = 4 * numel
    # compress reads the input and writes the payload; decompress reads the payload and writes 4n
    moved = in_bytes + p.payload_nbytes
    tcf, tdf, tkf = fresh
    tc, td, tk = fresh if steady is None else steady
    copy_bw, copy_bw_fresh = 2 * in_bytes / tk, 2 * in_bytes / tkf
    return CodecResult(
        codec=name,
        numel=numel,
        bits_per_element=8.0 * p.payload_nbytes / numel,
        rel_l2_error=err,
        compress_s=tc,
        decompress_s=td,
        compress_gbps=in_bytes / tc / 1e9,
        decompress_gbps=in_bytes / td / 1e9,
        compress_roofline=moved / tc / copy_bw,
        decompress_roofline=moved / td / copy_bw,
        copy_rw_gbps=copy_bw / 1e9,
        compiled=name in _QUANTISERS and _compiled_path(numel),
        encoder=_encoder_path(name, x),
        steady_state=steady is not None,
        fresh_compress_gbps=in_bytes / tcf / 1e9,
        fresh_decompress_gbps=in_bytes / tdf / 1e9,
        fresh_compress_roofline=moved / tcf / copy_bw_fresh,
        fresh_decompress_roofline=moved / tdf / copy_bw_fresh,
    )


def environment(device: str | torch.device = "cpu") -> dict[str, Any]:
    """Where the figures were measured."""
    dev = torch.device(device)
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "device": str(dev),
        "compile_mode": compile_mode(),
        "native_codecs": native_available() if dev.type == "cpu" else False,
    }
    if dev.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(dev)
    return info


TABLE_HEADER = (
    "codec",
    "bits/elem",
    "rel L2 err",
    "compress GB/s",
    "decompress GB/s",
    "compress roofline",
    "decompress roofline",
)
#: extra columns of ``format_table``: the fresh-page compress figures beside the headline ones.
FRESH_HEADER = ("compress GB/s fresh", "compress roofline fresh")


def table_rows(results: Sequence[CodecResult]) -> list[tuple[str, ...]]:
    """Formatted table cells, one row per codec, in ``TABLE_HEADER`` order."""
    return [
        (
            r.codec,
            f"{r.bits_per_element:.3f}",
            f"{r.rel_l2_error:.2e}",
            f"{r.compress_gbps:.2f}",
            f"{r.decompress_gbps:.2f}",
            f"{r.compress_roofline:.2f}",
            f"{r.decompress_roofline:.2f}",
        )
        for r in results
    ]


def format_table(results: Sequence[CodecResult]) -> str:
    """A plain-text table (for scripts and logs): ``TABLE_HEADER`` then ``FRESH_HEADER`` columns."""
    fresh = [(f"{r.fresh_compress_gbps:.2f}", f"{r.fresh_compress_roofline:.2f}") for r in results]
    rows = [TABLE_HEADER + FRESH_HEADER, *(a + b for a, b in zip(table_rows(results), fresh, strict=True))]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def report(results: Sequence[CodecResult], device: str | torch.device = "cpu") -> dict[str, Any]:
    """The JSON document the benchmark writes: environment, roofline and one entry per codec."""
    return {
        "steady_state": any(r.steady_state for r in results),
        "benchmark": "codecs",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment(device),
        "numel": results[0].numel if results else 0,
        "copy_rw_gbps": max((r.copy_rw_gbps for r in results), default=0.0),
        "notes": (
            "GB/s are 1e9 bytes of float32 input per second; roofline = (bytes read + written) / s "
            "divided by the (read + write) bytes / s of a tensor copy timed interleaved with that "
            "codec's repetitions (per-row copy_rw_gbps). Compress includes building "
            "the packet's bytes; best of reps after a warm-up call (compilation excluded). Headline figures: "
            "steady state (allocator reuses freed pages, as a peer compressing every round does) when "
            "steady_state is true; fresh_*: default allocator, fresh pages faulted in on every call."
        ),
        "results": [r.as_dict() for r in results],
    }
