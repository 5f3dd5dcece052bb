"""Compare swarmtrain's codecs: relative L2 error vs bits per element, labelled with throughput.

Run: ``python examples/compare_compressors.py [--size N] [--out codecs.png] [--from-json FILE]``.
Measures every codec on a standard-normal float32 tensor (or reads a ``benchmarks/codecs.py``
JSON), prints the table and draws the error/size trade-off as a PNG.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from compression.benchmark import CodecResult, benchmark_codecs, format_table  # noqa: E402


def load(path: str) -> list[CodecResult]:
    """Results from a JSON written by ``benchmarks/codecs.py`` or ``swarmtrain bench codecs --json``."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    return [CodecResult(**r) for r in doc["results"]]


def plot(results: list[CodecResult], out: str) -> Path:
    """Scatter of error vs bits per element; each point says its compress/decompress GB/s.

    Returns the file written: ``out``, with ``.png`` added when it names no image format.
    """
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        err = max(r.rel_l2_error, 1e-8)  # lossless codecs sit on the floor of the log axis
        ax.scatter(r.bits_per_element, err, s=40)
        ax.annotate(
            f"{r.codec}\n{r.compress_gbps:.2f} / {r.decompress_gbps:.2f} GB/s",
            (r.bits_per_element, err),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("payload bits per element")
    ax.set_ylabel("relative L2 error (one round trip)")
    ax.set_title(f"codecs on {results[0].numel:,} float32 elements (labels: compress / decompress)")
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
    print(f"wrote {plot(results, args.out)}")


if __name__ == "__main__":
    main()
