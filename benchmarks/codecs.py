"""Codec throughput at 64M float32 elements against a same-run tensor copy (the memory roofline).

Run: ``python benchmarks/codecs.py [--size N] [--device cpu|cuda] [--fresh-only] [--append]``. Prints a
table and writes ``benchmarks/results/codecs_<device>.json``. Each codec is timed twice in the run:
with fresh pages for every output (the default allocator), then in steady state (freed pages reused,
as a peer compressing every round has them); the headline columns are steady state, the ``fresh``
columns beside them the first. Compilation (``torch.compile`` of the quantisers) happens in a warm-up
call and is not timed; ``SWARMTRAIN_COMPILE_CODECS=0`` measures the eager path.

``--append`` also appends the run's per-codec figures (compress GB/s and roofline, encoder) with the
load before/after, the date and the commit to ``codecs_<device>_runs.json``. ``--summarize A-B``
(repeatable) only rewrites that file's ``summaries["A-B"]``: the range of each figure over runs A..B,
the figures the README quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import append_run, load_runs, write_json, write_report  # noqa: E402

from compression.benchmark import DEFAULT_CODECS, benchmark_codecs, format_table, report  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RUNS_NOTE = (
    "runs of python benchmarks/codecs.py --append: per codec the headline (steady-state) compress GB/s "
    "and fraction of the roofline, its encoder, the copy GB/s range timed beside the codecs, load "
    "before/after; summaries: ranges over run ranges, written by --summarize"
)


def _load1() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # pragma: no cover - not on Linux
        return None


def run_entry(
    doc: dict[str, Any], reps: int, load_before: float | None, load_after: float | None
) -> dict[str, Any]:
    """One run-series entry from a ``report()`` document: what the series keeps of the run."""
    results = doc["results"]
    entry: dict[str, Any] = {
        "created_utc": doc["created_utc"],
        "reps": reps,
        "steady_state": doc["steady_state"],
        "numel": doc["numel"],
        "load_avg_1min_before": load_before,
        "load_avg_1min_after": load_after,
        "copy_rw_gbps_min": round(min(r["copy_rw_gbps"] for r in results), 2),
        "copy_rw_gbps_max": round(max(r["copy_rw_gbps"] for r in results), 2),
    }
    for r in results:
        name = r["codec"]
        entry[f"{name}_compress_roofline"] = round(r["compress_roofline"], 3)
        entry[f"{name}_compress_gbps"] = round(r["compress_gbps"], 2)
        if r.get("encoder"):
            entry[f"{name}_encoder"] = r["encoder"]
    return entry


def _parse_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    a, b = int(lo), int(hi or lo)
    if a > b:
        raise ValueError(f"empty run range {text!r}")
    return a, b


def summarize(runs: list[dict[str, Any]], first: int, last: int) -> dict[str, Any]:
    """``[min, max]`` of every numeric figure over the runs numbered ``first..last``."""
    sel = [r for r in runs if first <= int(r.get("run", 0)) <= last]
    if not sel:
        raise ValueError(f"no runs numbered {first}..{last}")
    skip = {"run", "reps", "numel"}
    spans: dict[str, list[float]] = {}
    for r in sel:
        for k, v in r.items():
            if k in skip or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            lo, hi = spans.get(k, [v, v])
            spans[k] = [min(lo, v), max(hi, v)]
    return {"runs": [int(r["run"]) for r in sel], "ranges": dict(sorted(spans.items()))}


def write_summaries(path: Path, ranges: list[str]) -> dict[str, Any]:
    """Rewrite ``summaries[range]`` of the series at ``path`` for each range (``"A-B"``)."""
    data = load_runs(path, "codecs", RUNS_NOTE)
    summaries = dict(data.get("summaries", {}))
    for text in ranges:
        a, b = _parse_range(text)
        summaries[f"{a}-{b}"] = summarize(data["runs"], a, b)
    data["summaries"] = summaries
    write_json(path, data, indent=1)
    return summaries


def main(argv: list[str] | None = None) -> int:
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
    ap.add_argument("--append", action="store_true", help="also append the run to codecs_<device>_runs.json")
    ap.add_argument("--runs-json", default=None, help="default: benchmarks/results/codecs_<device>_runs.json")
    ap.add_argument(
        "--summarize",
        action="append",
        metavar="A-B",
        default=None,
        help="only rewrite the series' summary of runs A..B (repeatable) and print it",
    )
    args = ap.parse_args(argv)
    device = args.device.split(":")[0]
    runs_path = Path(args.runs_json or RESULTS / f"codecs_{device}_runs.json")
    if args.summarize:
        print(json.dumps(write_summaries(runs_path, args.summarize), indent=1))
        return 0
    load_before = _load1()
    results = benchmark_codecs(
        args.size,
        tuple(args.codec) if args.codec else DEFAULT_CODECS,
        reps=args.reps,
        device=args.device,
        steady_state=not args.fresh_only,
        progress=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    load_after = _load1()
    steady = any(r.steady_state for r in results)
    print(
        f"{args.size:,} float32 elements on {args.device}; copy (r+w, timed beside each codec) "
        f"{min(r.copy_rw_gbps for r in results):.1f}-{max(r.copy_rw_gbps for r in results):.1f} GB/s; "
        f"headline columns: {'steady state (reused pages)' if steady else 'fresh pages'}"
    )
    doc = report(results, args.device)
    write_report(Path(args.json or RESULTS / f"codecs_{device}.json"), doc, format_table(results))
    if args.append:
        entry = append_run(
            runs_path, "codecs", run_entry(doc, args.reps, load_before, load_after), note=RUNS_NOTE
        )
        print(f"appended run {entry['run']} to {runs_path} (load {load_before} -> {load_after})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
