"""int8 and ternary on the wire path: device tensor -> host bytes ready for the socket, and back.

``codec_section(device, sizes)`` is the ``codecs`` section of ``benchmarks/gpu.py``. For each codec it
times, over one tensor cut into chunks as the butterfly cuts a vector:

* ``compress``: ``compression.staging.compress_many`` (device quantisation, ``non_blocking`` copies into
  pooled pinned buffers on a side stream, chunk k+1 encoded while chunk k crosses the bus) up to the
  wire segments of every chunk (``StagedPacket.wire_parts``: memoryviews, no host copy);
* ``decompress``: every chunk's packet (``bytes``, as a peer's arrive) decoded onto the device;
* beside each, in the same run, the bound: one pinned device-to-host (host-to-device) copy of the
  same payload size (on the CPU: a host memcpy of it), in GB/s of fp32 input, and the old path
  (pageable ``.cpu()`` + ``tobytes`` out, pageable ``.to(device)`` in).

Figures are GB/s of fp32 input (``4 * numel / seconds``), best of ``reps``. Goals (issue 28): at least
100 GB/s, and at least 0.7 of the bound. Run alone: ``python benchmarks/gpu_codecs.py --device cpu``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compression import Int8Compressor, TernaryCompressor, staging  # noqa: E402
from compression.base import Codec, tensor_bytes  # noqa: E402
from compression.kernels import compile_mode  # noqa: E402
from swarmtrain.core.packet import Packet  # noqa: E402

GOAL_GBPS = 100.0
GOAL_FRACTION = 0.7
CODECS = ("int8", "ternary")
_DEFAULTS = {"cuda": (1 << 26, 1 << 22, 5), "cpu": (1 << 18, 1 << 16, 3)}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _best(fn: Callable[[], Any], reps: int, dev: torch.device) -> float:
    """Best wall seconds of ``fn`` over ``reps`` runs (after one untimed warm-up)."""
    fn()
    _sync(dev)
    best = float("inf")
    for _ in range(reps):
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    return best


def _make(name: str, dev: torch.device) -> Codec:
    return Int8Compressor(device=dev) if name == "int8" else TernaryCompressor(seed=1, device=dev)


def _chunks(x: torch.Tensor, chunk: int) -> list[tuple[torch.Tensor, str]]:
    return [(x[a : a + chunk], f"bench/{a}") for a in range(0, x.numel(), chunk)]


def _gbps(nbytes: float, seconds: float) -> float | None:
    return round(nbytes / seconds / 1e9, 2) if seconds > 0 and seconds != float("inf") else None


def _copy_bound(payload: int, dev: torch.device, reps: int) -> tuple[float, float]:
    """Seconds of one device->host and one host->device copy of ``payload`` bytes (pinned on CUDA;
    on the CPU both are one host memcpy, numpy's on this thread: no thread pool to wake)."""
    if dev.type != "cuda":
        a, b = np.zeros(payload, dtype=np.uint8), np.ones(payload, dtype=np.uint8)
        t = _best(lambda: np.copyto(a, b), reps, dev)
        return t, t
    host = torch.empty(payload, dtype=torch.uint8, pin_memory=True)
    src = torch.randint(0, 255, (payload,), dtype=torch.uint8, device=dev)
    d2h = _best(lambda: host.copy_(src, non_blocking=True), reps, dev)
    h2d = _best(lambda: src.copy_(host, non_blocking=True), reps, dev)
    return d2h, h2d


def _old_compress(codec: Codec, chunks: list[tuple[torch.Tensor, str]]) -> list[Packet]:
    """The path before staging: quantise on the device, then pageable ``.cpu()`` and ``tobytes``."""
    out = []
    for t, key in chunks:
        if t.device.type == "cpu":
            out.append(codec.compress(t, key=key))
            continue
        parts = codec.device_parts(t, key=key)  # type: ignore[attr-defined]
        bufs = tuple(tensor_bytes(*group) for group in parts.buffers)
        float(parts.top)  # the old finite check synchronised on the absmax
        out.append(Packet(parts.codec, parts.shape, parts.dtype, bufs, parts.params))
    return out


@contextmanager
def _pageable_uploads() -> Iterator[None]:
    """Decoders upload with a plain ``.to(device)`` (the old path) inside the block."""
    saved = staging.to_device
    staging.to_device = lambda src, device, pool=None: src.to(device)  # type: ignore[assignment]
    try:
        yield
    finally:
        staging.to_device = saved  # type: ignore[assignment]


def _staged_round(codec: Codec, chunks: list[tuple[torch.Tensor, str]]) -> None:
    held = [(s, s.wire_parts()) for s in staging.compress_many(codec, chunks)]
    for s, _ in held:  # the sends settled: the buffers serve the next round
        s.release()


def _identical(name: str, dev: torch.device, chunk: torch.Tensor) -> bool:
    """The device path's packet equals the CPU codec's for the same input, key and seed."""
    a = _make(name, dev).compress(chunk, key="same")
    b = _make(name, torch.device("cpu")).compress(chunk.cpu(), key="same")
    return a == b


def _fractions(rate: float | None, bound: float | None) -> dict[str, Any]:
    frac = round(rate / bound, 3) if rate and bound else None
    return {
        "gbps": rate,
        "bound_gbps": bound,
        "fraction": frac,
        "goal_met": rate is not None and rate >= GOAL_GBPS,
        "fraction_goal_met": frac is not None and frac >= GOAL_FRACTION,
    }


def _one_codec(name: str, x: torch.Tensor, chunk: int, reps: int) -> dict[str, Any]:
    dev, numel = x.device, x.numel()
    chunks = _chunks(x, chunk)
    codec = _make(name, dev)
    payload = sum(codec.payload_nbytes(t.numel()) for t, _ in chunks)
    d2h, h2d = _copy_bound(payload, dev, reps)
    scale = 4 * numel / payload  # GB/s of payload -> GB/s of fp32 input
    t_new = _best(lambda: _staged_round(codec, chunks), reps, dev)
    t_old = _best(lambda: _old_compress(codec, chunks), reps, dev)
    packets = [s.packet() for s in staging.compress_many(codec, chunks)]
    t_dec = _best(lambda: [codec.decompress(p) for p in packets], reps, dev)
    with _pageable_uploads():
        t_dec_old = _best(lambda: [codec.decompress(p) for p in packets], reps, dev)
    inp = 4 * numel
    comp = _fractions(_gbps(inp, t_new), _gbps(payload * scale, d2h))
    dec = _fractions(_gbps(inp, t_dec), _gbps(payload * scale, h2d))
    comp["old_gbps"], dec["old_gbps"] = _gbps(inp, t_old), _gbps(inp, t_dec_old)
    return {
        "payload_bytes": payload,
        "bound_payload_d2h_gbps": _gbps(payload, d2h),
        "bound_payload_h2d_gbps": _gbps(payload, h2d),
        "compress": comp,
        "decompress": dec,
        "identical_to_cpu": _identical(name, dev, chunks[0][0]),
    }


def codec_section(device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """The ``codecs`` section: see the module docstring. ``sizes`` may set ``codec_numel``,
    ``codec_chunk`` (elements per chunk) and ``codec_reps``; defaults depend on the device kind."""
    dev = torch.device(device)
    numel0, chunk0, reps0 = _DEFAULTS["cuda" if dev.type == "cuda" else "cpu"]
    numel = int(sizes.get("codec_numel", numel0))
    chunk = max(1, min(int(sizes.get("codec_chunk", chunk0)), numel))
    reps = max(1, int(sizes.get("codec_reps", reps0)))
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0)).to(dev)
    return {
        "device": str(dev),
        "numel": numel,
        "chunk": chunk,
        "reps": reps,
        "compile_mode": compile_mode(),
        "unit": "GB/s of fp32 input",
        "goal_gbps": GOAL_GBPS,
        "goal_fraction": GOAL_FRACTION,
        "bound": "pinned D2H/H2D copy of the payload" if dev.type == "cuda" else "host memcpy of the payload",
        "codecs": {name: _one_codec(name, x, chunk, reps) for name in CODECS},
    }


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_table(doc: dict[str, Any]) -> str:
    """The section as a table of at most 80 columns."""
    head = f"{'codec':8} {'way':10} {'GB/s':>8} {'bound':>8} {'frac':>6} {'old':>8} {'goal':>5}"
    lines = [f"codecs on {doc['device']}: {doc['numel']} elements, chunks of {doc['chunk']}", head]
    for name, r in doc["codecs"].items():
        for way in ("compress", "decompress"):
            f = r[way]
            ok = "yes" if f["goal_met"] and f["fraction_goal_met"] else "no"
            frac = "-" if f["fraction"] is None else f"{f['fraction']:.2f}"
            lines.append(
                f"{name:8} {way:10} {_fmt(f['gbps']):>8} {_fmt(f['bound_gbps']):>8} {frac:>6} "
                f"{_fmt(f['old_gbps']):>8} {ok:>5}"
            )
        lines.append(f"{'':8} identical to the CPU codec: {r['identical_to_cpu']}")
    lines.append(f"GB/s of fp32 input; bound: {doc['bound']}; goal >= {GOAL_GBPS:g} and >= {GOAL_FRACTION}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--numel", type=int, default=None)
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the section here")
    args = ap.parse_args()
    sizes = {
        k: v
        for k, v in (("codec_numel", args.numel), ("codec_chunk", args.chunk), ("codec_reps", args.reps))
        if v
    }
    doc = codec_section(args.device, sizes)
    print(format_table(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
