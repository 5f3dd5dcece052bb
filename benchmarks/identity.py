"""Wall time of ``swarmtrain identity FILE`` as a volunteer runs it: a fresh process each time, for a
new key (generated, written, read back) and for an existing one (read only).

Each run is a separate ``swarmtrain identity`` process timed from spawn to exit (interpreter start,
imports, key generation or read). Prints a table (median, min, max per case) and writes
``benchmarks/results/identity.json``. The goal (issue 31.7) is under 1 s.

    python benchmarks/identity.py               # about 10 s on 2 CPU cores
    python benchmarks/identity.py --runs 20
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import RESULTS, recorded, write_report  # noqa: E402

GOAL_S = 1.0


def _cli() -> list[str]:
    """The installed ``swarmtrain`` script where there is one (what a volunteer runs), else the module."""
    exe = shutil.which("swarmtrain")
    return [exe] if exe else [sys.executable, "-m", "swarmtrain"]


def _time_one(path: Path) -> float:
    t0 = time.perf_counter()
    done = subprocess.run([*_cli(), "identity", str(path)], capture_output=True, text=True, timeout=120)
    took = time.perf_counter() - t0
    if done.returncode != 0 or not done.stdout.strip().startswith("Qm"):
        raise SystemExit(f"swarmtrain identity failed (exit {done.returncode}): {done.stderr.strip()}")
    return took


def _summary(xs: list[float]) -> dict[str, Any]:
    med = statistics.median(xs)
    return {
        "runs_s": [round(x, 4) for x in xs],
        "median_s": round(med, 4),
        "min_s": round(min(xs), 4),
        "max_s": round(max(xs), 4),
        "goal_s": GOAL_S,
        "met": med < GOAL_S,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="processes per case (default 10)")
    ap.add_argument("--json", type=Path, default=RESULTS / "identity.json", help="where to write")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    new: list[float] = []
    existing: list[float] = []
    with tempfile.TemporaryDirectory(prefix="swarmtrain-idbench-") as tmp:
        for i in range(args.runs):
            key = Path(tmp) / f"vol{i}.key"
            new.append(_time_one(key))  # generates the key
            existing.append(_time_one(key))  # reads it back
    cases = {"new_key": _summary(new), "existing_key": _summary(existing)}
    doc = {"benchmark": "identity", **recorded(argv), "runs": args.runs, "cases": cases}
    rows = [f"{'case':<14}{'median':>9}{'min':>9}{'max':>9}  goal < {GOAL_S:g} s"]
    for name, c in cases.items():
        met = "met" if c["met"] else "NOT met"
        rows.append(f"{name:<14}{c['median_s']:>8.2f}s{c['min_s']:>8.2f}s{c['max_s']:>8.2f}s  {met}")
    write_report(args.json, doc, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
