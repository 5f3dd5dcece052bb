"""Compare swarmtrain's codecs: relative L2 error vs bits per element, labelled with throughput.

Run: ``python examples/compare_compressors.py [--size N] [--out codecs.png] [--from-json FILE]``.
Measures every codec on a standard-normal float32 tensor (or reads a ``benchmarks/codecs.py``
JSON), prints the table, draws the error/size trade-off as a PNG and writes the plotted numbers beside
it as JSON (same stem, ``.json``; a non-finite value is ``null``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from compression.benchmark import CodecResult, benchmark_codecs, format_table  # noqa: E402
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
    ap.add_argument("--size", type=int, default=1 << 22, help="elements of the test tensor")
    ap.add_argument("--out", default="compare_compressors.png")
    ap.add_argument("--from-json", default=None, help="plot a saved benchmark instead of measuring")
    args = ap.parse_args()
    results = load(args.from_json) if args.from_json else benchmark_codecs(args.size, reps=2)
    print(format_table(results))
    image = plot(results, args.out)
    print(f"wrote {image}")
    print(f"wrote {write_json(results, image)}")


if __name__ == "__main__":
    main()
