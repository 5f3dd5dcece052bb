"""SWARM on this machine: final loss and throughput per activation codec, against one process.

For each codec of ``--codecs`` runs ``swarmtrain simulate --strategy swarm`` with the same settings
(``swarmtrain.simulation.swarm.run_swarm_simulation``: real server and trainer processes on
127.0.0.1, optionally ``--kill-servers`` SIGKILLed mid-run), then trains the baseline once (the same
untied stages on the same micro-batches and optimizer steps in one process). Prints a table and writes
``benchmarks/results/swarm.json`` (each run replaces its ``--label`` entry) and ``swarm.png``.

    python benchmarks/swarm.py                            # none and int8, 4 servers, ~10 min on 2 cores
    python benchmarks/swarm.py --codecs none,bf16,int8 --steps 300 --kill-servers 1
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import RESULTS, finite, recorded  # noqa: E402

from swarmtrain.app.swarm_roles import SwarmSettings, train_baseline  # noqa: E402
from swarmtrain.core.config import load_config  # noqa: E402
from swarmtrain.simulation.swarm import run_swarm_simulation  # noqa: E402


def _plot(entry: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = entry["runs"]
    names = list(runs)
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.bar(names, [runs[n]["final_val_loss"] for n in names], color="tab:blue", label="SWARM")
    a.axhline(entry["baseline_val_loss"], color="k", ls="--", label="one process")
    a.set_ylabel("final validation loss")
    a.set_xlabel("activation codec")
    a.legend(loc="lower right")
    lo = min(entry["baseline_val_loss"], *(runs[n]["final_val_loss"] for n in names))
    a.set_ylim(lo * 0.95, None)
    b.bar(names, [runs[n]["throughput_samples_per_s"] for n in names], color="tab:green")
    b.set_ylabel("samples / s (trainers' loop)")
    b.set_xlabel("activation codec")
    fig.suptitle(
        f"SWARM {entry['servers']} servers / {entry['stages']} stages, {entry['trainers']} trainer(s), "
        f"{entry['kill_servers']} killed"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codecs", default="none,int8", help="comma-separated activation codecs")
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--trainers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150, help="micro-batches per trainer")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per trainer per step")
    ap.add_argument("--kill-servers", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "swarm.json")
    ap.add_argument("--label", default="current", help="the entry of the JSON this run replaces")
    args = ap.parse_args()
    cfg = load_config(
        None, {"train.steps": args.steps, "train.batch_size": args.batch_size, "peers.admission": "token"}
    )
    runs: dict[str, Any] = {}
    for codec in [c.strip() for c in args.codecs.split(",") if c.strip()]:
        settings = SwarmSettings(
            stages=args.stages,
            codec=codec,
            microbatches=args.steps,
            trainers=args.trainers,
            accumulate=args.accumulate,
        )
        res = run_swarm_simulation(cfg, settings, args.servers, kill_servers=args.kill_servers)
        runs[codec] = res.summary()
        print(
            f"{codec}: val {res.final_val_loss:.4f}, {res.throughput_samples_per_s:.1f} samples/s", flush=True
        )
    base, _ = train_baseline(  # the same micro-batches and steps as the swarm's
        cfg,
        SwarmSettings(
            stages=args.stages, microbatches=args.steps, trainers=args.trainers, accumulate=args.accumulate
        ),
    )
    head = f"{'codec':<8}{'val loss':>10}{'vs base':>9}{'samples/s':>11}"
    print(head + f"{'rerouted':>9}{'lost':>6}{'identical':>10}")
    for codec, r in runs.items():
        gap = 100.0 * (r["final_val_loss"] / base - 1.0)
        print(
            f"{codec:<8}{r['final_val_loss']:>10.4f}{gap:>8.1f}%{r['throughput_samples_per_s']:>11.1f}"
            f"{r['rerouted']:>9}{r['lost_microbatches']:>6}{'yes' if r['params_identical'] else 'NO':>10}"
        )
    print(f"{'one proc':<8}{base:>10.4f}")
    entry = {
        "recorded": recorded(),
        "preset": "tiny",
        "servers": args.servers,
        "stages": args.stages,
        "trainers": args.trainers,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "accumulate": args.accumulate,
        "kill_servers": args.kill_servers,
        "baseline_val_loss": base,
        "runs": runs,
    }
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    labelled = old.get("runs", {}) if old.get("benchmark") == "swarm" else {}
    result = {"benchmark": "swarm", "runs": {**labelled, args.label: entry}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(finite(result), indent=2, allow_nan=False) + "\n")
    png = args.out.with_suffix(".png")
    _plot(entry, png)
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
