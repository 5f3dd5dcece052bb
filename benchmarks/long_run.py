"""The long run of issue 16: every strategy's default against fp32 DataParallel over >= 20 outer steps.

Four workers train the ``tiny`` byte-level GPT for 600 local steps each (20 outer steps at the
default H = 30) through the in-process harness (``swarmtrain.app.bench.harness``: the same Trainer,
strategy and codec code as real peers), with the same data, seed, batch and learning-rate schedule
for all. Points: fp32 DataParallel (the reference), DiLoCo with int8, ternary and int4 pseudo-
gradients, Streaming DiLoCo with int4 and DeMo, each at the project's defaults. The two best points
and the reference are then re-run with real peer processes on 127.0.0.1 (hivemind DHT + libp2p
streams, byte ledger), so the figures are checked against the real path.

The goals of issue 16 are reported, met or not, from this one invocation:

* DiLoCo within 2 % of DataParallel's loss at >= 400x fewer bytes per token;
* DeMo within 5 % at >= 100x fewer bytes;
* Streaming DiLoCo: peak bytes per sync <= 1/F of DiLoCo's (same codec), loss within 1 % of it.

Usage::

    python benchmarks/long_run.py                 # 600 steps, 2 real-peer re-runs (~35 min, 2 cores)
    python benchmarks/long_run.py --quick         # smoke test: 2 workers, 8 steps, H=4, no real peers
    python benchmarks/long_run.py --seeds 3 --steps 120 --real-peers 0 --codecs ternary \
        --curve-points 4 --link 100mbit,50ms   # 3 seeds of 4 outer steps (~1 h on 2 loaded cores)

Outside ``--quick`` every evaluation uses 32 validation batches.

Writes ``benchmarks/results/long_run.json`` (+ ``.csv``, ``.png``), or ``--json PATH``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from swarmtrain.app.bench.link import parse_link
from swarmtrain.app.bench.stats import goal_verdict, mean_ci95, paired_gaps
from swarmtrain.app.bench.strategies import (
    Grid,
    GridPoint,
    grid_points,
    load_point,
    run_grid,
    settings,
    table_lines,
    write_outputs,
)

__all__ = ["points", "goals", "goal_lines", "main"]

RESULTS = Path(__file__).resolve().parent / "results"
DILOCO_CODECS = ("int8", "ternary", "int4")
STREAMING_CODEC = "int4"
#: validation batches per evaluation outside ``--quick`` (a benchmark's, as ``bench strategies``)
EVAL_BATCHES = 32


def points(inner_steps: int | None = None, codecs: tuple[str, ...] = DILOCO_CODECS) -> list[GridPoint]:
    """The reference, DiLoCo per codec (``codecs``; int4 always, Streaming DiLoCo's goal compares with
    it), Streaming DiLoCo int4 and DeMo, each at its defaults (H too, unless ``inner_steps`` is given)."""
    h = {"strategy.inner_steps": inner_steps} if inner_steps else {}
    ref = grid_points(Grid(strategies=()))[0]
    out = [ref]
    wanted = [c for c in DILOCO_CODECS if c in codecs or c == STREAMING_CODEC]
    for codec in wanted:
        out.append(
            GridPoint(
                f"diloco {codec}",
                "diloco",
                codec,
                {"strategy.name": "diloco", "compression.codec": codec, **h},
            )
        )
    out.append(
        GridPoint(
            f"streaming_diloco {STREAMING_CODEC}",
            "streaming_diloco",
            STREAMING_CODEC,
            {"strategy.name": "streaming_diloco", "compression.codec": STREAMING_CODEC, **h},
        )
    )
    out.append(GridPoint("demo", "demo", "", {"strategy.name": "demo"}))
    return out


def _goal(name: str, met: bool, figure: str, verdict: str | None = None) -> dict[str, Any]:
    return {"goal": name, "met": met, "measured": figure, **({"verdict": verdict} if verdict else {})}


def _within(r: dict[str, Any], limit: float) -> str:
    """``stats.goal_verdict`` of ``r``'s gap to DataParallel: "met" only when its whole 95 % interval
    (over seeds) is at most ``limit``."""
    return goal_verdict(r["gap_vs_dp"], r.get("gap_vs_dp_ci95"), limit)


def _pm(r: dict[str, Any]) -> str:
    """``±`` the 95 % half-width of ``r``'s gap to DataParallel (nothing with one seed)."""
    ci = r.get("gap_vs_dp_ci95")
    return "" if ci is None else f"±{ci:.2%}"


def goals(rows: list[dict[str, Any]], fragments: int) -> list[dict[str, Any]]:
    """Each goal of issue 16 with the figures it was judged on (in-process rows)."""
    by = {r["label"]: r for r in rows}
    out = []
    diloco = [r for r in rows if r["strategy"] == "diloco"]
    far = [r for r in diloco if (r["reduction_vs_dp"] or 0) >= 400]
    best = min(far, key=lambda r: r["gap_vs_dp"]) if far else min(diloco, key=lambda r: r["gap_vs_dp"])
    verdict = _within(best, 0.02)
    out.append(
        _goal(
            "DiLoCo within 2 % at >= 400x fewer bytes",
            bool(far) and verdict.startswith("met"),
            f"{best['label']}: {best['gap_vs_dp']:+.2%}{_pm(best)} at {best['reduction_vs_dp']:.0f}x",
            verdict,
        )
    )
    demo = by["demo"]
    verdict = _within(demo, 0.05)
    out.append(
        _goal(
            "DeMo within 5 % at >= 100x fewer bytes",
            verdict.startswith("met") and (demo["reduction_vs_dp"] or 0) >= 100,
            f"{demo['gap_vs_dp']:+.2%}{_pm(demo)} at {demo['reduction_vs_dp']:.0f}x",
            verdict,
        )
    )
    stream, same = by[f"streaming_diloco {STREAMING_CODEC}"], by[f"diloco {STREAMING_CODEC}"]
    peak = stream["peak_sync_bytes"] / same["peak_sync_bytes"]
    loss, ci = _paired_loss_gap(stream, same)
    verdict = goal_verdict(loss, ci, 0.01)
    interval = "" if ci is None else f"±{ci:.2%}"
    out.append(
        _goal(
            f"Streaming DiLoCo: peak/sync <= 1/{fragments} of DiLoCo's, loss within 1 %",
            peak <= 1 / fragments and verdict.startswith("met"),
            f"peak {peak:.3f}x DiLoCo {STREAMING_CODEC}'s, loss {loss:+.2%}{interval}",
            verdict if ci is not None else None,
        )
    )
    return out


def _paired_loss_gap(r: dict[str, Any], ref: dict[str, Any]) -> tuple[float, float | None]:
    """``r``'s loss relative to ``ref``'s: the mean and 95 % interval of the per-seed gaps when both
    ran the same seeds; else the ratio of the means, without an interval."""
    mine, theirs = r.get("val_losses") or [], ref.get("val_losses") or []
    if len(mine) > 1 and len(mine) == len(theirs) and r.get("data_seeds") == ref.get("data_seeds"):
        return mean_ci95(paired_gaps(mine, theirs))
    return r["final_val_loss"] / ref["final_val_loss"] - 1, None


def goal_lines(met: list[dict[str, Any]]) -> list[str]:
    """The goals as Markdown list items (the README's, and what ``main`` prints, less the marks); a goal
    judged with seeds says its verdict ("met" only when the whole 95 % interval is inside the goal;
    "unclear" when it straddles it)."""
    lines = []
    for g in met:
        word = g.get("verdict", "met" if g["met"] else "not met")
        lines.append(f"- {word if g['met'] else f'**{word}**'}: {g['goal']}: {g['measured']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the points (and the real-peer re-runs), print the table and the goals, write the outputs."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 workers, 8 steps, H=4: a smoke test")
    ap.add_argument("--real-peers", type=int, default=None, help="best points re-run with real peers [2]")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per point (mean and 95 %% interval) [1]")
    ap.add_argument("--steps", type=int, default=None, help="local steps per worker [600; --quick: 8]")
    ap.add_argument("--curve-points", type=int, default=0, help="syncs recorded on each run's curve [0]")
    ap.add_argument(
        "--codecs", default=",".join(DILOCO_CODECS), help="DiLoCo's codecs (int4 always) [int8,ternary,int4]"
    )
    ap.add_argument("--link", default=None, help="modelled wall-clock over a link, e.g. 100mbit,50ms")
    ap.add_argument("--json", type=Path, default=None, help="JSON path (CSV and PNG beside it)")
    args = ap.parse_args(argv)
    link = parse_link(args.link) if args.link else None
    workers, steps = (2, 8) if args.quick else (4, 600)
    if args.steps is not None:
        if args.steps < 1:
            ap.error("--steps must be >= 1")
        steps = args.steps
    real = args.real_peers if args.real_peers is not None else (0 if args.quick else 2)
    base: dict[str, Any] = {"train.steps": steps, "train.eval_interval": 10_000_000}
    if not args.quick:
        base["train.eval_batches"] = EVAL_BATCHES
    path = args.json or RESULTS / ("long_run_quick.json" if args.quick else "long_run.json")
    meta = {**settings(base, workers, None), "seeds": args.seeds or 1, "quick": args.quick}
    if link is not None:
        meta["link"] = link.as_json()
    codecs = tuple(c.strip() for c in args.codecs.split(","))
    unknown = sorted(set(codecs) - set(DILOCO_CODECS))
    if unknown:
        ap.error(f"--codecs: {', '.join(unknown)} is not one of {', '.join(DILOCO_CODECS)}")
    pts = points(4 if args.quick else None, codecs)

    def on_row(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        loss = row.get("real_final_val_loss", row["final_val_loss"])
        print(f"{row['label']}: val loss {loss:.4f}", flush=True)
        write_outputs(rows, meta, path)

    from swarmtrain.simulation.runner import run_simulation

    rows = run_grid(
        base,
        pts,
        workers,
        real_peers=real,
        real_run=run_simulation,
        on_row=on_row,
        seeds=args.seeds,
        curve_points=args.curve_points,
    )
    streaming = next(p for p in pts if p.strategy == "streaming_diloco")
    fragments = getattr(load_point(None, {**base, **streaming.overrides}).strategy, "fragments", 1)
    met = goals(rows, fragments)
    doc = json.loads(path.read_text())
    doc["goals"] = met
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    for line in table_lines(rows):
        print(line)
    for g in met:
        print(f"{'met' if g['met'] else 'NOT met'}: {g['goal']}\n  {g['measured']}")
    print(f"wrote {path} (+ .csv, .png)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
