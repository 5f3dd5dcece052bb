"""DataParallel (fp32), DiLoCo, StreamingDiLoCo and DeMo at equal tokens over real peers.

Each strategy trains the ``tiny`` byte-level GPT with N real peer processes on 127.0.0.1
(``swarmtrain.simulation.runner.run_simulation``: hivemind DHT + P2P streams, byte ledger), with the same
steps, batch, seed, learning-rate schedule and data for all. Reported per strategy: final validation
loss (mean over peers), ledger bytes sent per token and per step, the most bytes any peer sent in a
single sync, compute utilization (1 - time ``step()`` blocked on communication / wall time) and wall
time. The goals of issue 5 are checked against runs of this same invocation:

* StreamingDiLoCo: peak bytes per sync <= 1/F of DiLoCo's, final loss within 1 % of DiLoCo's;
* DeMo: >= 100x fewer bytes per step than fp32 DataParallel, final loss within 5 % of it (AdamW).

Usage::

    python benchmarks/strategies.py            # 4 peers, 150 steps each (~15-20 min on 2 cores)
    python benchmarks/strategies.py --quick    # smoke test: 2 peers, 8 steps (results not kept)

Writes ``benchmarks/results/strategies.json`` and ``strategies.png`` (loss vs bytes/token, log x).
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Any

from swarmtrain.core.config import Config, load_config
from swarmtrain.simulation.runner import SimulationResult, run_simulation

__all__ = ["RunSpec", "settings", "run_all", "check_goals", "main"]

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import RESULTS, pyplot, save_figure, write_report  # noqa: E402


class RunSpec:
    """One row of the benchmark: a label and the config overrides on top of the shared ones."""

    def __init__(self, label: str, overrides: dict[str, Any]) -> None:
        self.label = label
        self.overrides = overrides


def settings(quick: bool) -> tuple[int, dict[str, Any], list[RunSpec]]:
    """``(peers, shared overrides, runs)``; the same steps/batch/seed/schedule for every run."""
    steps, h, f, tau = (8, 4, 2, 1) if quick else (150, 30, 4, 2)
    peers = 2 if quick else 4
    shared: dict[str, Any] = {
        "model.preset": "tiny",
        "train.steps": steps,
        "train.batch_size": 16,
        "train.seed": 0,
        "train.lr": 1e-3,
        "train.min_lr": 1e-4,
        "train.warmup_steps": 2 if quick else 20,
        "train.eval_interval": 100_000,  # evaluate once, at the end
        "train.eval_batches": 4 if quick else 32,  # >= 32 for a benchmark (issue 32)
        "train.log_interval": 10,
        "peers.min_peers": peers,
        "peers.join_window": 3.0,
        "strategy.sync_timeout": 120.0,
    }
    runs = [
        RunSpec(
            "data_parallel fp32",
            {"strategy.name": "data_parallel", "compression.codec": "none"},
        ),
        RunSpec(
            "diloco fp32",
            {"strategy.name": "diloco", "compression.codec": "none", "strategy.inner_steps": h},
        ),
        RunSpec(
            "streaming_diloco fp32",
            {
                "strategy.name": "streaming_diloco",
                "compression.codec": "none",
                "strategy.inner_steps": h,
                "strategy.fragments": f,
                "strategy.overlap": tau,
                "strategy.mixing": 0.5,
            },
        ),
        RunSpec(
            "demo",
            {
                "strategy.name": "demo",
                "compression.codec": "none",
                "strategy.demo_chunk": 64,
                "strategy.demo_topk": 8,
                "strategy.demo_decay": 0.999,
                "strategy.demo_sign": True,
                "strategy.demo_values": "fp16",
            },
        ),
    ]
    return peers, shared, runs


def _row(label: str, cfg: Config, r: SimulationResult) -> dict[str, Any]:
    s = r.summary()
    s["label"] = label
    s["bytes_sent_per_peer_per_step"] = r.bytes_sent_per_peer / max(r.steps, 1)
    s["committed_rounds"] = [o.committed_rounds for o in r.outcomes]
    s["failed_rounds"] = [o.failed_rounds for o in r.outcomes]
    s["peer_val_losses"] = [o.final_val_loss for o in r.outcomes]
    s["comm_wait_s"] = [o.comm_wait_s for o in r.outcomes]
    s["strategy_options"] = cfg.strategy.model_dump()
    return s


def run_all(quick: bool, timeout: float) -> dict[str, Any]:
    """Run every strategy once and return the JSON document (rows + settings + goal checks)."""
    peers, shared, runs = settings(quick)
    rows: list[dict[str, Any]] = []
    for spec in runs:
        cfg = load_config(None, {**shared, **spec.overrides}, env={})
        t0 = time.perf_counter()
        logging.getLogger(__name__).info("running %s", spec.label)
        res = run_simulation(cfg, peers, timeout=timeout)
        rows.append(_row(spec.label, cfg, res))
        print(f"  {spec.label}: loss {res.final_val_loss:.4f}, {time.perf_counter() - t0:.0f} s", flush=True)
    return {
        "benchmark": "strategies",
        "quick": quick,
        "peers": peers,
        "shared_settings": shared,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "rows": rows,
        "goals": check_goals(rows),
    }


def check_goals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's two goals, computed from this run's rows (True/False plus the measured ratios)."""
    by = {r["strategy"]: r for r in rows}
    dp, dl, sd, demo = by["data_parallel"], by["diloco"], by["streaming_diloco"], by["demo"]
    frags = int(sd["strategy_options"]["fragments"])
    peak_ratio = sd["peak_sync_bytes_sent"] / max(dl["peak_sync_bytes_sent"], 1)
    sd_loss = sd["final_val_loss"] / dl["final_val_loss"] - 1.0
    demo_bytes = dp["bytes_sent_per_peer_per_step"] / max(demo["bytes_sent_per_peer_per_step"], 1.0)
    demo_loss = demo["final_val_loss"] / dp["final_val_loss"] - 1.0
    return {
        "streaming_peak_over_diloco_peak": peak_ratio,
        "streaming_peak_goal": f"<= 1/F = {1 / frags:.3f}",
        "streaming_peak_met": peak_ratio <= 1.0 / frags,
        "streaming_loss_vs_diloco": sd_loss,
        "streaming_loss_met": sd_loss <= 0.01,
        "demo_bytes_per_step_reduction_vs_dp": demo_bytes,
        "demo_bytes_met": demo_bytes >= 100.0,
        "demo_loss_vs_dp": demo_loss,
        "demo_loss_met": demo_loss <= 0.05,
    }


def _table(doc: dict[str, Any]) -> str:
    head = (
        f"{'strategy':<24}{'val loss':>9}{'B/token':>11}{'B/step/peer':>13}{'peak sync B':>13}"
        f"{'util':>7}{'wall s':>8}{'ident':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in doc["rows"]:
        lines.append(
            f"{r['label']:<24}{r['final_val_loss']:>9.4f}{r['bytes_per_token']:>11.2f}"
            f"{r['bytes_sent_per_peer_per_step']:>13,.0f}{r['peak_sync_bytes_sent']:>13,}"
            f"{r['compute_utilization']:>7.1%}{r['wall_s']:>8.0f}"
            f"{'yes' if r['params_identical'] else 'NO':>7}"
        )
    g = doc["goals"]
    lines += [
        "",
        f"StreamingDiLoCo peak/DiLoCo peak = {g['streaming_peak_over_diloco_peak']:.3f} "
        f"(goal {g['streaming_peak_goal']}: {'met' if g['streaming_peak_met'] else 'NOT met'}); "
        f"loss vs DiLoCo {g['streaming_loss_vs_diloco']:+.2%} (goal <= +1%: "
        f"{'met' if g['streaming_loss_met'] else 'NOT met'})",
        f"DeMo bytes/step: {g['demo_bytes_per_step_reduction_vs_dp']:.0f}x fewer than fp32 DataParallel "
        f"(goal >= 100x: {'met' if g['demo_bytes_met'] else 'NOT met'}); loss vs DataParallel "
        f"{g['demo_loss_vs_dp']:+.2%} (goal <= +5%: {'met' if g['demo_loss_met'] else 'NOT met'})",
    ]
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for r in doc["rows"]:
        ax.scatter(r["bytes_per_token"], r["final_val_loss"], s=60)
        ax.annotate(
            r["label"],
            (r["bytes_per_token"], r["final_val_loss"]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_xlabel("ledger bytes sent per token (per peer, log)")
    ax.set_ylabel("final validation loss")
    steps = doc["shared_settings"]["train.steps"]
    ax.set_title(f"tiny GPT, {doc['peers']} peers, {steps} steps each, equal tokens")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run, print the table, write JSON and PNG."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 peers, 8 steps: a smoke test")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (PNG beside it)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    doc = run_all(args.quick, args.timeout)
    out = args.out or RESULTS / ("strategies_quick.json" if args.quick else "strategies.json")
    write_report(out, doc, _table(doc), plot=_plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
