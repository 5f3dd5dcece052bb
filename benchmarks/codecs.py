"""Codec throughput at 64M float32 elements against a same-run tensor copy (the memory roofline).

Run: ``python benchmarks/codecs.py [--size N] [--device cpu|cuda]``. Prints a table and writes
``benchmarks/results/codecs_<device>.json``. Compilation (``torch.compile`` of the quantisers) happens
in a warm-up call and is not timed; ``SWARMTRAIN_COMPILE_CODECS=0`` measures the eager path, and
``--reuse-memory`` lets the allocator keep freed pages (``codecs_<device>_reuse.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from compression.benchmark import DEFAULT_CODECS, benchmark_codecs, format_table, keep_freed_memory, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1 << 26)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--codec", action="append", default=None)
    ap.add_argument("--json", default=None, help="default: benchmarks/results/codecs_<device>[_reuse].json")
    ap.add_argument(
        "--reuse-memory",
        action="store_true",
        help="let glibc keep freed memory, so fresh-page faults do not dominate (see keep_freed_memory)",
    )
    args = ap.parse_args()
    reuse = keep_freed_memory() if args.reuse_memory else False
    results = benchmark_codecs(
        args.size,
        tuple(args.codec) if args.codec else DEFAULT_CODECS,
        reps=args.reps,
        device=args.device,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    print(f"{args.size:,} float32 elements on {args.device}; copy {results[0].copy_rw_gbps:.2f} GB/s (r+w)")
    print(format_table(results))
    stem = f"codecs_{args.device.split(':')[0]}{'_reuse' if reuse else ''}"
    out = Path(args.json or Path(__file__).parent / "results" / f"{stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(report(results, args.device, reuse_memory=reuse), indent=2) + "\n", encoding="utf-8"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
