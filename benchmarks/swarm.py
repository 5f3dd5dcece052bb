"""SWARM on this machine: throughput versus servers per stage (with and without a server killed
mid-run), bytes per sample and final loss per activation codec, and DiLoCo on as many peers for scale.

Every SWARM point is one ``swarmtrain simulate --strategy swarm`` run
(``swarmtrain.simulation.swarm.run_swarm_simulation``: a bootstrap, the stage servers and the trainers
as real processes on 127.0.0.1, one torch thread each), all on the same micro-batches:

* scaling: ``--per-stage`` servers on each of ``--stages`` stages (``--peers`` = their product) with
  fp32 activations, and again with one server SIGKILLed mid-run wherever a stage has two or more;
* codecs: ``--codec-per-stage`` servers per stage with each activation codec of ``--codecs`` (the fp32
  point is the scaling run's);
* one process: the same stages on the same micro-batches and optimizer steps
  (``swarmtrain.app.swarm.roles.train_baseline``), the loss every SWARM run should reach;
* DiLoCo: ``swarmtrain simulate --strategy diloco`` with as many peers as the codec runs have
  processes (servers + trainers), the same model and about the same number of samples in all.

``samples/s`` is the trainers' loop (servers' start-up excluded); DiLoCo's is its samples over its
slowest peer's training time. ``bytes/sample`` counts every byte every peer sent (SWARM: hidden states,
their gradients, step closes and the stages' gradient sums; DiLoCo: its syncs and state transfers).
Prints the Markdown table of the README and writes ``benchmarks/results/swarm.json`` (each run
replaces its ``--label`` entry) and ``swarm.png``.

    python benchmarks/swarm.py                      # the README's table, ~20 min on 2 cores
    python benchmarks/swarm.py --per-stage 1,2 --codecs none --steps 20 --no-diloco   # smoke size
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import RESULTS, pyplot, recorded, save_figure, write_report  # noqa: E402

from swarmtrain.app.swarm.roles import train_baseline  # noqa: E402
from swarmtrain.core.config import Config, load_config  # noqa: E402
from swarmtrain.core.swarm_config import SwarmConfig  # noqa: E402
from swarmtrain.simulation.swarm import run_swarm_simulation  # noqa: E402

#: SWARM keys a row keeps (the rest of the simulation's report is dropped: it holds per-peer maps)
_KEEP = (
    "servers_per_stage", "trainers", "codec", "samples", "final_val_loss", "throughput_samples_per_s",
    "rerouted", "lost_microbatches", "params_identical", "killed", "wall_s", "steps_taken",
    "bytes_sent_by_kind", "phase_s", "step_failures", "duplicate_backwards",
)  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def swarm_row(cfg: Config, args: argparse.Namespace, per_stage: int, codec: str, kill: int) -> dict[str, Any]:
    """One SWARM run's figures."""
    settings = SwarmConfig(
        stages=args.stages,
        codec=codec,
        microbatches=args.steps,
        trainers=args.trainers,
        accumulate=args.accumulate,
    )
    t0 = time.perf_counter()
    res = run_swarm_simulation(cfg, settings, per_stage * args.stages, kill_servers=kill)
    s = res.summary()
    row: dict[str, Any] = {k: s[k] for k in _KEEP}
    sent = sum(int(v) for v in s["bytes_sent_by_kind"].values())
    pipe = sum(int(s["bytes_sent_by_kind"].get(k, 0)) for k in ("activations", "gradients"))
    row.update(
        label=f"swarm {per_stage}/stage {codec}" + (f" kill {kill}" if kill else ""),
        per_stage=per_stage,
        kill_servers=kill,
        bytes_per_sample=sent / max(res.samples, 1),
        pipeline_bytes_per_sample=pipe / max(res.samples, 1),
    )
    print(
        f"{row['label']}: val {res.final_val_loss:.4f}, {res.throughput_samples_per_s:.1f} samples/s, "
        f"{row['bytes_per_sample']:.0f} B/sample, lost {res.lost_microbatches}, "
        f"{time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    return row


def diloco_row(cfg: Config, peers: int, steps: int, timeout: float) -> dict[str, Any]:
    """DiLoCo with ``peers`` real peers, ``steps`` steps each, H = steps // 3 (three syncs), at the
    constant learning rate SWARM trains at (no warm-up, no decay)."""
    from swarmtrain.simulation.runner import run_simulation

    inner = max(1, steps // 3)
    over = {
        "strategy.name": "diloco",
        "strategy.inner_steps": inner,
        "train.steps": steps,
        "train.warmup_steps": 0,  # the constant rate SWARM trains at
        "train.min_lr": cfg.train.lr,
    }
    dcfg = load_config(None, {**_flat(cfg), **over}, env={})
    t0 = time.perf_counter()
    res = run_simulation(dcfg, peers, timeout=timeout)
    block = 128 if cfg.model.block_size is None else cfg.model.block_size
    samples = sum(o.tokens for o in res.outcomes) // block
    seconds = max((o.wall_s for o in res.outcomes), default=0.0)
    sent = sum(o.bytes_sent for o in res.outcomes)
    row = {
        "label": f"diloco {peers} peers",
        "peers": peers,
        "steps_per_peer": steps,
        "inner_steps": inner,
        "samples": samples,
        "final_val_loss": res.final_val_loss,
        "throughput_samples_per_s": samples / seconds if seconds > 0 else 0.0,
        "bytes_per_sample": sent / max(samples, 1),
        "params_identical": res.params_identical,
        "wall_s": res.wall_s,
    }
    print(
        f"{row['label']}: val {res.final_val_loss:.4f}, {row['throughput_samples_per_s']:.1f} samples/s, "
        f"{row['bytes_per_sample']:.0f} B/sample, {time.perf_counter() - t0:.0f} s",
        flush=True,
    )
    return row


def _flat(cfg: Config) -> dict[str, Any]:
    """The benchmark's own overrides of ``cfg`` (what ``base_config`` set), as dotted keys."""
    return {
        "train.batch_size": cfg.train.batch_size,
        "train.threads": cfg.train.threads,
        "peers.admission": cfg.peers.admission,
    }


def base_config(batch_size: int) -> Config:
    """The run's config: tiny preset, one torch thread per process, admission by token."""
    return load_config(
        None, {"train.batch_size": batch_size, "train.threads": 1, "peers.admission": "token"}, env={}
    )


def _fmt_row(r: dict[str, Any], base: float) -> str:
    if r["label"].startswith("diloco"):
        what = f"DiLoCo, {r['peers']} peers (H={r['inner_steps']})"
        cells = [what, "-", "-", "-", "-"]
    else:
        what = f"{r['per_stage']}/stage ({sum(r['servers_per_stage'])} servers)"
        codec = {"none": "fp32"}.get(r["codec"], r["codec"])
        cells = [what, str(r["kill_servers"]), codec, str(r["rerouted"]), str(r["lost_microbatches"])]
    gap = 100.0 * (r["final_val_loss"] / base - 1.0)
    pipe = f"{r['pipeline_bytes_per_sample'] / 1e3:,.1f}" if "pipeline_bytes_per_sample" in r else "-"
    cells += [
        f"{r['throughput_samples_per_s']:.1f}",
        pipe,
        f"{r['bytes_per_sample'] / 1e3:,.1f}",
        f"{r['final_val_loss']:.4f}",
        f"{gap:+.1f} %",
    ]
    return "| " + " | ".join(cells) + " |"


def markdown_table(entry: dict[str, Any]) -> str:
    """The README's table of one entry of ``swarm.json``."""
    base = float(entry["baseline_val_loss"])
    head = (
        "| run | killed | activations | rerouted | lost | samples/s | hidden kB/sample | all kB/sample "
        "| val loss | vs one process |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [_fmt_row(r, base) for r in entry["rows"]]
    rows.append(f"| one process, same stages and micro-batches | | | | | | | | {base:.4f} | |")
    return "\n".join([head, *rows])


def _plot(entry: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    rows = entry["rows"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    for kill, style in ((0, "o-"), (1, "s--")):
        pts = [r for r in rows if r.get("codec") == "none" and r.get("kill_servers") == kill]
        if pts:
            label = "one server killed" if kill else "none killed"
            a.plot(
                [r["per_stage"] for r in pts],
                [r["throughput_samples_per_s"] for r in pts],
                style,
                label=label,
            )
    for r in rows:
        if r["label"].startswith("diloco"):
            a.axhline(r["throughput_samples_per_s"], color="k", ls=":", label=r["label"])
    a.set_xticks(sorted({r["per_stage"] for r in rows if "per_stage" in r}))
    a.set_xlabel("servers per stage")
    a.set_ylabel("samples / s")
    a.legend(fontsize=8)
    codecs = [r for r in rows if r.get("per_stage") == entry["codec_per_stage"] and not r.get("kill_servers")]
    names = [{"none": "fp32"}.get(r["codec"], r["codec"]) for r in codecs]
    b.bar(names, [r["final_val_loss"] for r in codecs], color="tab:blue")
    b.axhline(entry["baseline_val_loss"], color="k", ls="--", label="one process")
    lo = min([entry["baseline_val_loss"], *(r["final_val_loss"] for r in codecs)])
    b.set_ylim(lo * 0.97, None)
    for i, r in enumerate(codecs):
        b.annotate(
            f"{r['bytes_per_sample'] / 1e3:,.0f} kB/sample", (i, r["final_val_loss"]), ha="center", fontsize=8
        )
    b.set_ylabel("final validation loss")
    b.legend(fontsize=8, loc="lower right")
    fig.suptitle(
        f"SWARM, {entry['stages']} stages, {entry['trainers']} trainers x {entry['steps']} micro-batches"
    )
    fig.tight_layout()
    save_figure(fig, path)


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--per-stage", default="1,2,3", help="servers per stage of the scaling runs")
    ap.add_argument("--codecs", default="none,bf16,int8", help="comma-separated activation codecs")
    ap.add_argument("--codec-per-stage", type=int, default=2, help="servers per stage of the codec runs")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=120, help="micro-batches per trainer")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--accumulate", type=int, default=2, help="micro-batches per trainer per step")
    ap.add_argument("--no-kill", action="store_true", help="skip the runs with a server killed")
    ap.add_argument("--no-diloco", action="store_true", help="skip the DiLoCo run")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    ap.add_argument("--out", type=Path, default=RESULTS / "swarm.json")
    ap.add_argument("--label", default="current", help="the entry of the JSON this run replaces")
    return ap.parse_args()


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every run of the benchmark; returns the JSON entry."""
    cfg = base_config(args.batch_size)
    rows: list[dict[str, Any]] = []
    for per in _ints(args.per_stage):
        rows.append(swarm_row(cfg, args, per, "none", 0))
        if per >= 2 and not args.no_kill:
            rows.append(swarm_row(cfg, args, per, "none", 1))
    for codec in [c.strip() for c in args.codecs.split(",") if c.strip()]:
        if codec != "none" or args.codec_per_stage not in _ints(args.per_stage):
            rows.append(swarm_row(cfg, args, args.codec_per_stage, codec, 0))
    settings = SwarmConfig(
        stages=args.stages, microbatches=args.steps, trainers=args.trainers, accumulate=args.accumulate
    )
    base, _ = train_baseline(cfg, settings)  # the same micro-batches and steps as the swarm's
    if not args.no_diloco:
        peers = args.codec_per_stage * args.stages + args.trainers
        steps = max(3, round(args.trainers * args.steps / peers))  # about the swarm's samples
        rows.append(diloco_row(cfg, peers, steps, args.timeout))
    return {
        "recorded": recorded(),
        "preset": "tiny",
        "stages": args.stages,
        "trainers": args.trainers,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "accumulate": args.accumulate,
        "codec_per_stage": args.codec_per_stage,
        "threads_per_process": 1,
        "baseline_val_loss": base,
        "rows": rows,
    }


def main() -> None:
    args = _args()
    entry = run_all(args)
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    labelled = old.get("runs", {}) if old.get("benchmark") == "swarm" else {}
    labelled = {k: v for k, v in labelled.items() if "rows" in v}  # entries of this script's layout
    result = {"benchmark": "swarm", "runs": {**labelled, args.label: entry}}
    write_report(
        args.out, result, markdown_table(entry), plot=lambda d, png: _plot(d["runs"][args.label], png)
    )


if __name__ == "__main__":
    main()
