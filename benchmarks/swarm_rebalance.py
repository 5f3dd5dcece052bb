"""SWARM rebalancing on this machine: a pipeline started lopsided (3 servers on stage 0, 1 on stage 1)
with rebalancing, against the same layout held fixed and against the balanced layout (2/2).

Every point is one ``swarmtrain.simulation.swarm.run_swarm_simulation`` run (a bootstrap, 4 stage
servers and ``--trainers`` trainers as real processes on 127.0.0.1, one torch thread each), all on
the same micro-batches and optimizer steps. On a machine with few cores every server competes for
the same CPU, so the stages are given an emulated device time (``--device-s`` seconds per
micro-batch on each server: ``SwarmConfig.device_s``), as slower GPUs would: stage 1's single
server is then the pipeline's bottleneck in the 3/1 layout, and a second server there doubles its
rate.

Rows: ``fixed 3/1`` (rebalancing off), ``rebalanced 3/1`` (on, the default rule: a move once the same
plan held for ``--patience`` seconds), ``fixed 2/2``. Columns: samples per second over the whole
training loop, and for the rebalanced run before its first move and after the mover caught up; the
moves; the final validation loss against one process on the same micro-batches and steps; whether
each stage's replicas ended identical.

    python benchmarks/swarm_rebalance.py              # ~10 min on 2 cores

Prints an 80-column table and writes ``benchmarks/results/swarm_rebalance.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import RESULTS, loadavg, pyplot, recorded, save_figure, write_report  # noqa: E402

from swarmtrain.app.swarm.roles import train_baseline  # noqa: E402
from swarmtrain.core.config import Config, load_config  # noqa: E402
from swarmtrain.core.swarm_config import SwarmConfig  # noqa: E402
from swarmtrain.simulation.swarm import run_swarm_simulation  # noqa: E402

__all__ = ["POINTS", "table_lines", "main"]

#: (label, servers per stage, rebalancing on)
POINTS: tuple[tuple[str, list[int], bool], ...] = (
    ("fixed 3/1", [3, 1], False),
    ("rebalanced 3/1", [3, 1], True),
    ("fixed 2/2", [2, 2], False),
)


def _settings(args: argparse.Namespace, rebalance: bool) -> SwarmConfig:
    return SwarmConfig(
        stages=2,
        microbatches=args.steps,
        trainers=args.trainers,
        accumulate=args.accumulate,
        device_s=args.device_s,
        rebalance=rebalance,
        patience=args.patience,
    )


def point(
    cfg: Config, args: argparse.Namespace, label: str, layout: list[int], rebalance: bool
) -> dict[str, Any]:
    """One run's figures."""
    t0 = time.perf_counter()
    res = run_swarm_simulation(
        cfg, _settings(args, rebalance), sum(layout), layout=layout, timeout=args.timeout
    )
    row = {
        "label": label,
        "layout": layout,
        "rebalance": rebalance,
        "servers_per_stage_end": res.servers_per_stage_end,
        "moves": res.moves,
        "throughput_samples_per_s": res.throughput_samples_per_s,
        "throughput_before_moves": res.throughput_before_moves,
        "throughput_after_moves": res.throughput_after_moves,
        "final_val_loss": res.final_val_loss,
        "params_identical": res.params_identical,
        "lost_microbatches": res.lost_microbatches,
        "step_failures": res.step_failures,
        "wall_s": res.wall_s,
        "loadavg": loadavg(),
    }
    print(
        f"{label}: {res.throughput_samples_per_s:.1f} samples/s, moves {len(res.moves)}, "
        f"val {res.final_val_loss:.4f}, {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    return row


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table_lines(entry: dict[str, Any]) -> list[str]:
    """The table (at most 80 columns) of one JSON entry."""
    base = float(entry["baseline_val_loss"])
    out = [
        f"{'run':<15} {'end':>4} {'moves':>5} {'samples/s':>9} {'before':>7} {'after':>7} "
        f"{'val loss':>8} {'vs 1 proc':>9} {'same':>4}",
    ]
    for r in entry["rows"]:
        end = "/".join(str(n) for n in r["servers_per_stage_end"])
        gap = 100.0 * (r["final_val_loss"] / base - 1.0)
        out.append(
            f"{r['label']:<15} {end:>4} {len(r['moves']):>5} {r['throughput_samples_per_s']:>9.1f} "
            f"{_rate(r['throughput_before_moves']):>7} {_rate(r['throughput_after_moves']):>7} "
            f"{r['final_val_loss']:>8.4f} {gap:>+8.2f}% {'yes' if r['params_identical'] else 'NO':>4}"
        )
    out.append(f"{'one process':<15} {'':>4} {'':>5} {'':>9} {'':>7} {'':>7} {base:>8.4f}")
    return out


def _plot(entry: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    rows = entry["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names, values, colors = [], [], []
    for r in rows:
        names.append(r["label"])
        values.append(r["throughput_samples_per_s"])
        colors.append("tab:gray")
        if r["throughput_before_moves"] is not None and r["throughput_after_moves"] is not None:
            names += ["  before move", "  after move"]
            values += [r["throughput_before_moves"], r["throughput_after_moves"]]
            colors += ["tab:red", "tab:green"]
    ax.bar(names, values, color=colors)
    ax.set_ylabel("samples / s")
    ax.set_title(f"SWARM rebalancing, {entry['device_s']} s emulated device time per stage")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--trainers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=64, help="micro-batches per trainer")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--accumulate", type=int, default=2, help="micro-batches per trainer per step")
    ap.add_argument("--device-s", type=float, default=0.3, help="emulated seconds per micro-batch")
    ap.add_argument("--patience", type=float, default=3.0, help="seconds a move must be planned")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--out", type=Path, default=RESULTS / "swarm_rebalance.json")
    return ap.parse_args()


def main() -> None:
    args = _args()
    cfg = load_config(
        None, {"train.batch_size": args.batch_size, "train.threads": 1, "peers.admission": "token"}, env={}
    )
    rows = [point(cfg, args, label, layout, on) for label, layout, on in POINTS]
    base, _ = train_baseline(cfg, _settings(args, False))
    entry = {
        "benchmark": "swarm_rebalance",
        "recorded": recorded(),
        "trainers": args.trainers,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "accumulate": args.accumulate,
        "device_s": args.device_s,
        "patience": args.patience,
        "baseline_val_loss": base,
        "rows": rows,
    }
    write_report(args.out, entry, table_lines(entry), plot=_plot)


if __name__ == "__main__":
    main()
