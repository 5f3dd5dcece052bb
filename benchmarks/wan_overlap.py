"""Overlap under a bandwidth cap: compute utilization of DiLoCo vs StreamingDiLoCo at the same H.

Four training peers and a bootstrap node run in their own network namespaces, joined by veth pairs
to a bridge, every link capped with ``tc tbf`` (20 Mbit/s by default, both directions;
``swarmtrain.simulation.netns``). Each peer is ``swarmtrain.simulation.runner``'s peer process, which
enters its node's namespace first (``netns.in_namespace``, as ``simulate --topology`` starts its
peers). Both strategies send fp32 pseudo-gradients (codec
``none``), so a DiLoCo sync of the tiny model moves megabytes through the cap and the training loop
stalls on it, while StreamingDiLoCo sends one fragment at a time in a background thread and joins it
``tau`` steps later. Reported per strategy: compute utilization (1 - time ``step()`` blocked on
communication / training wall time, mean over peers), the wait per sync, bytes, loss, identical
parameters. Needs root (``ip netns``); uses only 10.213.0.0/24 inside namespaces it creates and
deletes them in ``finally`` (and leftovers of a crashed run at start).

Usage::

    sudo python benchmarks/wan_overlap.py              # writes benchmarks/results/wan_overlap.json
    sudo python benchmarks/wan_overlap.py --quick      # 2 short runs (wan_overlap_quick.json)
    sudo python benchmarks/wan_overlap.py --append     # also append the run to wan_overlap_runs.json

``--append`` adds the run (with date, load and commit) to ``wan_overlap_runs.json`` and rewrites that
file's ``summary``: per strategy the range over all runs of the figures the README quotes.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import queue
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as a script or imported by tests/wan
    sys.path.insert(0, str(HERE))

from runlog import append_run, load_runs, write_json, write_report  # noqa: E402

from peers.dht.process import process_context  # noqa: E402
from swarmtrain.core.config import Config, load_config  # noqa: E402
from swarmtrain.core.errors import SwarmError  # noqa: E402
from swarmtrain.simulation.netns import Wan, in_namespace  # noqa: E402
from swarmtrain.simulation.runner import (  # noqa: E402
    PeerOutcome,
    bootstrap_main,
    params_identical,
    peer_main,
    quiet_resource_tracker,
    stop_peers,
)

__all__ = ["WanRun", "run_wan", "run_benchmark", "initial_val_loss", "main"]

RESULTS = HERE / "results"
RUNS = RESULTS / "wan_overlap_runs.json"
RUNS_NOTE = (
    "runs of sudo python benchmarks/wan_overlap.py --append (each: that run's wan_overlap.json plus when, "
    "load and commit); summary: per strategy, ranges over all runs, rewritten by the script"
)
SUMMARY_FIELDS = ("compute_utilization", "mean_wait_per_sync_s", "final_val_loss", "initial_val_loss")


def series_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per strategy, ``[min, max]`` over ``runs`` of each of ``SUMMARY_FIELDS`` (absent ones skipped)."""
    out: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for r in run.get("rows", []):
            cell = out.setdefault(r["strategy"], {})
            for f in SUMMARY_FIELDS:
                v = r.get(f)
                if isinstance(v, int | float):
                    lo, hi = cell.get(f, [v, v])
                    cell[f] = [round(min(lo, v), 4), round(max(hi, v), 4)]
    return {"runs": [run.get("run") for run in runs], "ranges": out}


def write_summary(path: Path) -> dict[str, Any]:
    """Recompute the series' summary from its runs and store it in the file."""
    data = load_runs(path, "wan_overlap", RUNS_NOTE)
    data["summary"] = series_summary(data["runs"])
    write_json(path, data, indent=1)
    summary: dict[str, Any] = data["summary"]
    return summary


@dataclass
class WanRun:
    """One strategy's outcome over the emulated WAN."""

    strategy: str
    outcomes: list[PeerOutcome]
    wall_s: float

    @property
    def compute_utilization(self) -> float:
        """Mean over peers of ``1 - comm_wait / wall`` (as ``swarmtrain.simulation.runner`` computes it)."""
        return 1.0 - sum(o.comm_wait_s / max(o.wall_s, 1e-9) for o in self.outcomes) / len(self.outcomes)

    def summary(self) -> dict[str, Any]:
        """Plain data for the JSON file."""
        n = len(self.outcomes)
        syncs = [o.committed_rounds + o.failed_rounds for o in self.outcomes]
        return {
            "strategy": self.strategy,
            "compute_utilization": self.compute_utilization,
            "comm_wait_s_per_peer": [o.comm_wait_s for o in self.outcomes],
            "train_wall_s_per_peer": [o.wall_s for o in self.outcomes],
            "syncs_per_peer": syncs,
            "committed_rounds": [o.committed_rounds for o in self.outcomes],
            "failed_rounds": [o.failed_rounds for o in self.outcomes],
            "mean_wait_per_sync_s": sum(o.comm_wait_s for o in self.outcomes) / max(sum(syncs), 1),
            "bytes_sent_per_peer": sum(o.bytes_sent for o in self.outcomes) / n,
            "peak_sync_bytes_sent": max(o.peak_sync_bytes_sent for o in self.outcomes),
            "final_val_loss": sum(o.final_val_loss or float("nan") for o in self.outcomes) / n,
            "params_identical": params_identical(self.outcomes),
            "wall_s": self.wall_s,
        }


def _start(wan: Wan, node: int, target: Any, args: tuple[Any, ...]) -> Any:
    """Start ``target(*args)`` in node ``node``'s namespace, in its own session, dying with us."""
    from peers.dht.process import spawn_function

    return spawn_function(functools.partial(in_namespace, wan.ns(node), target), args, name=f"node{node}")


def _outcome(payload: dict[str, Any]) -> PeerOutcome:
    payload = dict(payload)
    payload["sync_digests"] = {int(k): v for k, v in payload["sync_digests"].items()}
    return PeerOutcome(**payload)


def run_wan(wan: Wan, cfg: Config, n_peers: int, timeout: float = 900.0) -> WanRun:
    """Train ``cfg`` with a bootstrap on node 0 and peer ``r`` on node ``r + 1`` of ``wan``."""

    cfg = cfg.model_copy(deep=True)
    cfg.train.progress = False
    cfg.train.threads = 1
    quiet_resource_tracker()
    q = process_context().Queue()
    procs: list[Any] = []
    # SWARMTRAIN_WAN_LOG=WARNING shows the peers' warnings (e.g. why a round failed) on stderr
    level = getattr(logging, os.environ.get("SWARMTRAIN_WAN_LOG", "ERROR").upper(), logging.ERROR)
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    outcomes: dict[int, PeerOutcome] = {}

    def at(node: int, c: Config) -> str:
        c = c.model_copy(deep=True)
        c.peers.host_maddrs = [f"/ip4/{wan.ip(node)}/tcp/0"]
        c.peers.announce_maddrs = []
        return c.model_dump_json()

    def get() -> tuple[str, int, Any]:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SwarmError("the WAN run did not finish in time")
        try:
            msg: tuple[str, int, Any] = q.get(timeout=min(left, 1.0))
            return msg
        except queue.Empty:
            # procs[0] is the bootstrap, procs[r + 1] peer r (which may leave once it reported)
            dead = [i - 1 for i, p in enumerate(procs) if not p.alive and i - 1 not in outcomes]
            if dead:
                raise SwarmError(f"ranks {dead} died without an outcome (-1: the bootstrap)") from None
            return ("tick", -1, None)

    try:
        procs.append(_start(wan, 0, bootstrap_main, (at(0, cfg), q, level)))
        initial: list[str] = []
        while not initial:
            kind, _, payload = get()
            if kind == "error":
                raise SwarmError(f"bootstrap failed: {payload}")
            if kind == "bootstrap":
                initial = list(payload)
        cfg.peers.initial_peers = initial
        for r in range(n_peers):
            procs.append(_start(wan, r + 1, peer_main, (r, n_peers, at(r + 1, cfg), q, level)))
        while len(outcomes) < n_peers:
            kind, rank, payload = get()
            if kind == "error":
                raise SwarmError(f"peer {rank} failed: {payload}")
            if kind == "done":
                outcomes[rank] = _outcome(payload)
    finally:
        stop_peers(procs)
        q.close()
    return WanRun(cfg.strategy.name, [outcomes[r] for r in range(n_peers)], time.perf_counter() - t0)


def settings(quick: bool) -> dict[str, Any]:
    """Shared settings and the two strategies' options (same H, same steps, batch, seed, data)."""
    h, f, tau = (10, 2, 5) if quick else (20, 4, 5)
    return {
        "peers": 4,
        "rate_mbit": 20.0,
        "shared": {
            "model.preset": "tiny",
            "train.steps": 2 * h,
            "train.batch_size": 16,
            "train.seed": 0,
            "train.warmup_steps": 5,
            "train.eval_interval": 100_000,
            "train.eval_batches": 2,
            "compression.codec": "none",
            "peers.min_peers": 4,
            "strategy.inner_steps": h,
            "strategy.sync_timeout": 180.0,
            "peers.round_timeout": 180.0,
        },
        "diloco": {"strategy.name": "diloco"},
        "streaming_diloco": {
            "strategy.name": "streaming_diloco",
            "strategy.fragments": f,
            "strategy.overlap": tau,
            "strategy.mixing": 0.5,
        },
    }


def initial_val_loss(s: dict[str, Any]) -> float:
    """Validation loss of the peers' common starting point (step 0) under settings ``s``.

    Every peer builds the model from ``train.seed`` and evaluates the same ``train.eval_batches``
    batches, so this is the loss a run that learned nothing ends with (about ``ln 256 = 5.545`` for
    bytes; a little above it at initialisation). Computed in this process, strategy ``local``.
    """
    from swarmtrain.app.train.trainer import Trainer

    keep = {k: v for k, v in s["shared"].items() if k.startswith(("model.", "train.", "data."))}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            None, {**keep, "strategy.name": "local", "train.progress": False, "train.out_dir": tmp}, env={}
        )
        return Trainer(cfg).evaluate()


def run_benchmark(quick: bool = False, timeout: float = 900.0) -> dict[str, Any]:
    """Build the emulated WAN, check the cap with a raw TCP transfer, run both strategies."""
    s = settings(quick)
    n = s["peers"]
    rows = []
    start_loss = initial_val_loss(s)
    with Wan(n + 1, s["rate_mbit"]) as wan:
        probe_bytes = 2_500_000
        probe_s = wan.transfer(1, 2, probe_bytes)
        qdisc = wan.qdiscs(1)
        for name in ("diloco", "streaming_diloco"):
            cfg = load_config(None, {**s["shared"], **s[name]}, env={})
            run = run_wan(wan, cfg, n, timeout=timeout)
            row = run.summary()
            row["strategy_options"] = cfg.strategy.model_dump()
            row["initial_val_loss"] = start_loss
            rows.append(row)
            print(f"  {name}: utilization {row['compute_utilization']:.1%}", flush=True)
    return {
        "benchmark": "wan_overlap",
        "quick": quick,
        "settings": s,
        "link_check": {
            "bytes": probe_bytes,
            "seconds": probe_s,
            "mbit_per_s": probe_bytes * 8 / probe_s / 1e6,
            "qdisc": qdisc,
        },
        "note": (
            "StreamingDiLoCo's last fragment round (started at the final step) is joined in close(), "
            "outside step(), so its wait is not in comm_wait_s; at the cap it is one fragment's transfer."
        ),
        "rows": rows,
    }


def _table(doc: dict[str, Any]) -> str:
    lines = [
        f"link check: {doc['link_check']['mbit_per_s']:.1f} Mbit/s measured "
        f"(cap {doc['settings']['rate_mbit']} Mbit/s; {doc['link_check']['qdisc']})",
        f"{'strategy':<18}{'util':>8}{'wait/sync s':>13}{'syncs':>7}{'sent/peer MB':>14}"
        f"{'peak sync MB':>14}{'val loss':>10}{'ident':>7}",
    ]
    for r in doc["rows"]:
        lines.append(
            f"{r['strategy']:<18}{r['compute_utilization']:>8.1%}{r['mean_wait_per_sync_s']:>13.2f}"
            f"{r['syncs_per_peer'][0]:>7}{r['bytes_sent_per_peer'] / 1e6:>14.2f}"
            f"{r['peak_sync_bytes_sent'] / 1e6:>14.2f}{r['final_val_loss']:>10.4f}"
            f"{'yes' if r['params_identical'] else 'NO':>7}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run, print the table, write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="H=10, F=2: a short smoke run (not kept)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per strategy run")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--append", action="store_true", help=f"also append the run to {RUNS.name}")
    ap.add_argument("--summarize", action="store_true", help=f"only rewrite and print {RUNS.name}'s summary")
    args = ap.parse_args(argv)
    if args.summarize:
        print(json.dumps(write_summary(RUNS), indent=1))
        return 0
    if args.append and args.quick:
        ap.error("--append keeps full runs only (drop --quick)")
    doc = run_benchmark(args.quick, args.timeout)
    out = args.out or RESULTS / ("wan_overlap_quick.json" if args.quick else "wan_overlap.json")
    write_report(out, doc, _table(doc))
    if args.append:
        entry = append_run(RUNS, "wan_overlap", doc, note=RUNS_NOTE)
        print(f"appended run {entry['run']} to {RUNS}")
        print(json.dumps(write_summary(RUNS), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
