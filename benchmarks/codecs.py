"""Codec throughput at 64M float32 elements against a same-run tensor copy (the memory roofline).

Run: ``python benchmarks/codecs.py [--size N] [--device cpu|cuda] [--fresh-only]``. Prints a table and
writes ``benchmarks/results/codecs_<device>.json``. Each codec is timed twice in the run: with fresh
pages for every output (the default allocator), then in steady state (freed pages reused, as a peer
compressing every round has them); the headline columns are steady state, the ``fresh`` columns
beside them the first. Compilation (``torch.compile`` of the quantisers) happens in a warm-up call and
is not timed; ``SWARMTRAIN_COMPILE_CODECS=0`` measures the eager path.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from compression.benchmark import DEFAULT_CODECS, benchmark_codecs, format_table, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1 << 26)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--codec", action="append", default=None)
    ap.add_argument("--json", default=None, help="default: benchmarks/results/codecs_<device>.json")
    ap.add_argument(
        "--fresh-only",
        action="store_true",
        help="skip the steady-state pass (keep_freed_memory); only fresh-page figures",
    )
    args = ap.parse_args()
    results = benchmark_codecs(
        args.size,
        tuple(args.codec) if args.codec else DEFAULT_CODECS,
        reps=args.reps,
        device=args.device,
        steady_state=not args.fresh_only,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    steady = any(r.steady_state for r in results)
    print(
        f"{args.size:,} float32 elements on {args.device}; copy (r+w, timed beside each codec) "
        f"{min(r.copy_rw_gbps for r in results):.1f}-{max(r.copy_rw_gbps for r in results):.1f} GB/s; "
        f"headline columns: {'steady state (reused pages)' if steady else 'fresh pages'}"
    )
    print(format_table(results))
    out = Path(args.json or Path(__file__).parent / "results" / f"codecs_{args.device.split(':')[0]}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report(results, args.device), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
