"""Compare swarmtrain's codecs: relative L2 error vs bits per element, labelled with throughput.

Run: ``python examples/compare_compressors.py [--size N] [--out codecs.png] [--from-json FILE]``.
Measures every codec on a standard-normal float32 tensor (or reads a ``benchmarks/codecs.py``
JSON), prints an 80-column table, draws the error/size trade-off as a PNG and writes the numbers
beside it as CSV and JSON (same stem; a non-finite value is ``null`` in JSON, empty in CSV). The
default size is the smallest out of this machine's last-level cache; a smaller one (the data then
stays in cache, so throughput measures the cache) and a roofline fraction above 1 are warned about.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from compression.benchmark import CodecResult, benchmark_codecs  # noqa: E402
from swarmtrain.app.bench.codecs import (  # noqa: E402
    cache_warning,
    default_size,
    last_level_cache_bytes,
    mark_above,
)
from swarmtrain.core.jsonsafe import dumps  # noqa: E402

#: lossless codecs (error 0) sit on this floor of the log axis
ERROR_FLOOR = 1e-8


def load(path: str) -> list[CodecResult]:
    """Results from a JSON written by ``benchmarks/codecs.py`` or ``swarmtrain bench codecs --json``."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    return [CodecResult(**r) for r in doc["results"]]


def points(results: list[CodecResult]) -> list[dict[str, Any]]:
    """What the plot shows, one dict per codec: x (bits per element), the measured error, the error
    as drawn (at least :data:`ERROR_FLOOR`) and the label's compress/decompress GB/s."""
    return [
        {
            "codec": r.codec,
            "bits_per_element": r.bits_per_element,
            "rel_l2_error": r.rel_l2_error,
            "plotted_error": max(r.rel_l2_error, ERROR_FLOOR),  # NaN stays NaN (not drawn)
            "compress_gbps": r.compress_gbps,
            "decompress_gbps": r.decompress_gbps,
        }
        for r in results
    ]


def title(results: list[CodecResult]) -> str:
    return f"codecs on {results[0].numel:,} float32 elements (labels: compress / decompress)"


def write_json(results: list[CodecResult], image: Path) -> Path:
    """The plotted numbers as JSON beside ``image`` (same stem, ``.json``); returns its path."""
    path = image.with_suffix(".json")
    doc = {"title": title(results), "numel": results[0].numel, "error_floor": ERROR_FLOOR}
    path.write_text(dumps({**doc, "points": points(results)}, indent=2) + "\n", encoding="utf-8")
    return path


def table(results: list[CodecResult], mark: float = 1.0) -> str:
    """The results as plain text no wider than 80 columns; a roofline fraction above ``mark`` gets ``!``."""

    def frac(x: float) -> str:
        return f"{x:.2f}" + ("!" if x > mark else " ")

    heads = [("", "codec"), ("bits /", "element"), ("rel L2", "error"), ("compress", "GB/s")]
    heads += [("decompress", "GB/s"), ("roofline", "compress"), ("roofline", "decompress")]
    widths = (14, 8, 10, 10, 12, 11, 12)
    lines = [
        "".join(
            f"{h[row]:<{w}}" if i == 0 else f"{h[row]:>{w}}"
            for i, (h, w) in enumerate(zip(heads, widths, strict=True))
        )
        for row in (0, 1)
    ]
    for r in results:
        lines.append(
            f"{r.codec:<14.14}{r.bits_per_element:>8.3f}{r.rel_l2_error:>10.2e}{r.compress_gbps:>10.2f}"
            f"{r.decompress_gbps:>12.2f}{frac(r.compress_roofline):>11}{frac(r.decompress_roofline):>12}"
        )
    copy = results[0].copy_rw_gbps if results else 0.0
    numel = results[0].numel if results else 0
    lines.append(f"on {numel:,} float32 elements; copy {copy:.1f} GB/s r+w; ! = above {mark:g} (see warning)")
    return "\n".join(lines)


def write_csv(results: list[CodecResult], image: Path) -> Path:
    """Every measured figure, one row per codec, as CSV beside ``image`` (same stem, ``.csv``)."""
    path = image.with_suffix(".csv")
    rows = [r.as_dict() for r in results]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: "" if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}
            )
    return path


def warning(results: list[CodecResult], measured_here: bool, mark: float, llc: int) -> str | None:
    """One line when the table measures a cache (a measurement of this machine only) or a roofline
    fraction is above ``mark``."""
    best = {r.codec: max(r.compress_roofline, r.decompress_roofline) for r in results}
    marked = {k: v for k, v in best.items() if v > mark}
    if measured_here:
        return cache_warning(results[0].numel, llc, marked)
    if marked:
        over = ", ".join(f"{k} {v:.2f}" for k, v in marked.items())
        return f"warning: roofline fractions above 1 ({over}): the copy timed beside them ran slow"
    return None


def plot(results: list[CodecResult], out: str) -> Path:
    """Scatter of error vs bits per element; each point says its compress/decompress GB/s.

    Returns the file written: ``out``, with ``.png`` added when it names no image format.
    """
    fig, ax = plt.subplots(figsize=(8, 5))
    for p in points(results):
        ax.scatter(p["bits_per_element"], p["plotted_error"], s=40)
        ax.annotate(
            f"{p['codec']}\n{p['compress_gbps']:.2f} / {p['decompress_gbps']:.2f} GB/s",
            (p["bits_per_element"], p["plotted_error"]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("payload bits per element")
    ax.set_ylabel("relative L2 error (one round trip)")
    ax.set_title(title(results))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = Path(out)
    if path.suffix.lstrip(".").lower() not in fig.canvas.get_supported_filetypes():
        path = path.with_name(path.name + ".png")  # what savefig would write, said out loud
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description="error vs bits per element of every codec")
    ap.add_argument(
        "--size", type=int, default=None, help="elements of the test tensor [smallest out of the cache]"
    )
    ap.add_argument("--out", default="compare_compressors.png")
    ap.add_argument("--from-json", default=None, help="plot a saved benchmark instead of measuring")
    args = ap.parse_args()
    llc = last_level_cache_bytes()
    size = args.size or default_size(llc)
    results = load(args.from_json) if args.from_json else benchmark_codecs(size, reps=2)
    mark = mark_above(results[0].numel, llc) if not args.from_json else 1.0
    print(table(results, mark))
    line = warning(results, not args.from_json, mark, llc)
    if line:
        print(line, file=sys.stderr)
    image = plot(results, args.out)
    print(f"wrote {write_csv(results, image)}")
    print(f"wrote {image}")
    print(f"wrote {write_json(results, image)}")


if __name__ == "__main__":
    main()
