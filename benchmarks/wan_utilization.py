"""Compute utilization per strategy across three emulated regions (issue 14: "compute utilization per
strategy on that topology").

For each strategy this runs the user's own command as a subprocess::

    swarmtrain simulate --peers 3 --topology examples/topologies/three_regions.toml \\
        --strategy S --steps N --json PATH

three peers, one per region (10 ms RTT inside a region, 80 / 120 / 150 ms between, 50 Mbit/s per
peer, ``tc tbf`` rate caps and a userspace delay proxy in network namespaces: root only), each
strategy with its own defaults (DiLoCo and Streaming DiLoCo H = 30, the int8 codec; DeMo's own
payload). From the simulate JSON it keeps one row per strategy: the compute utilization
(``1 - time the training loop waited on communication / training wall time``, averaged over the
peers), the rounds committed and failed, the wait per round (seconds a training loop blocked per
round it took part in: a blocking strategy's round time as the loop sees it, less for Streaming
DiLoCo, which overlaps its rounds with training), the bytes each peer sent (byte ledger), the final
validation loss, whether the peers ended identical, the exit code and the wall time of the command.

Usage::

    sudo python benchmarks/wan_utilization.py                  # 4 strategies x 90 steps
    sudo python benchmarks/wan_utilization.py --quick --json /tmp/wu.json   # 2 strategies x 20 steps

Every strategy runs ``--runs`` times (3; ``--quick``: 1), each run a fresh network; ``summary`` holds
per strategy the median over its runs with the range. Writes
``benchmarks/results/wan_utilization.json`` and ``wan_utilization.png`` (bars of the median
utilization per strategy with the range), or ``--json PATH`` and the PNG beside it, and prints an
80-column table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from runlog import (  # noqa: E402
    RESULTS,
    cell,
    median_range,
    number,
    pyplot,
    recorded,
    save_figure,
    strategy_list,
    write_report,
)

__all__ = ["STRATEGIES", "TOPOLOGY", "command", "row", "summarize", "table_lines", "main"]

STRATEGIES = ("data_parallel", "diloco", "streaming_diloco", "demo")
TOPOLOGY = ROOT / "examples" / "topologies" / "three_regions.toml"
PEERS = 3  # one per region
STEPS = 90  # DiLoCo's default H = 30: three rounds
#: --quick: the two strategies at either end, 20 steps, H = 10 (two DiLoCo rounds)
QUICK_STEPS, QUICK_H, QUICK_STRATEGIES = 20, 10, ("data_parallel", "diloco")
#: strategies that take ``-H`` (DiLoCo's H; Streaming DiLoCo's too)
TAKES_H = ("diloco", "streaming_diloco")
SW = [sys.executable, "-m", "swarmtrain"]


def command(strategy: str, steps: int, json_path: Path, inner_steps: int | None = None) -> list[str]:
    """The ``swarmtrain simulate --topology`` command line of one strategy's run."""
    cmd = [
        *SW,
        "simulate",
        "--peers",
        str(PEERS),
        "--topology",
        str(TOPOLOGY.relative_to(ROOT)),
        "--strategy",
        strategy,
        "--steps",
        str(steps),
        "--json",
        str(json_path),
    ]
    if inner_steps is not None and strategy in TAKES_H:
        cmd += ["-H", str(inner_steps)]
    return cmd


def row(strategy: str, doc: dict[str, Any] | None, rc: int, wall_s: float) -> dict[str, Any]:
    """One strategy's row from the simulate JSON (``doc``; ``None`` when it wrote none)."""
    d = doc or {}
    topo = d.get("topology") or {}
    return {
        "strategy": strategy,
        "compressor": d.get("compressor"),
        "inner_steps": d.get("inner_steps"),
        "rc": rc,
        "compute_utilization": number(d.get("compute_utilization")),
        "rounds_committed": d.get("rounds_committed"),
        "rounds_failed": d.get("rounds_failed"),
        "wait_per_round_s": number(d.get("wait_per_round_s")),
        "comm_wait_s_per_peer": number(d.get("comm_wait_s_per_peer")),
        "bytes_sent_per_peer": number(d.get("bytes_sent_per_peer")),
        "final_val_loss": number(d.get("final_val_loss")),
        "params_identical": d.get("params_identical"),
        "sim_wall_s": number(d.get("wall_s")),  # the simulated run itself
        "wall_s": round(wall_s, 1),  # the whole command: namespaces, start, run, teardown
        "rtt_ms_measured": topo.get("rtt_ms_measured"),
        "regions": topo.get("regions"),
    }


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per strategy, over its runs that exited 0: the median and the range of the compute
    utilization, the wait per round and the final loss, and whether every run ended identical."""
    out = []
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        mine = [r for r in rows if r["strategy"] == strategy]
        ok = [r for r in mine if r["rc"] == 0]
        entry: dict[str, Any] = {"strategy": strategy, "runs": len(ok), "runs_failed": len(mine) - len(ok)}
        for key in ("compute_utilization", "wait_per_round_s", "final_val_loss", "bytes_sent_per_peer"):
            entry[key], entry[f"{key}_range"] = median_range([r[key] for r in ok if r[key] is not None])
        entry["params_identical"] = bool(ok) and all(r["params_identical"] is True for r in ok)
        out.append(entry)
    return out


def _mb(x: Any) -> str:
    return cell(x / 1e6 if isinstance(x, int | float) else None, ".1f")


def table_lines(rows: list[dict[str, Any]], summary: list[dict[str, Any]] | None = None) -> list[str]:
    """The rows as a table of at most 80 columns (util: compute utilization; c/f: rounds committed/
    failed; s/round: seconds a training loop waited per round; MB sent: per peer; wall: seconds of
    the whole command), then per strategy the median utilization over the runs and its range."""
    head = (
        f"{'strategy':<16} {'util':>5} {'c/f':>7} {'s/round':>7} {'MB sent':>7} "
        f"{'loss':>6} {'same':>4} {'wall':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        same = {True: "yes", False: "NO"}.get(r["params_identical"], "-")
        cf = cell(r["rounds_committed"], "d") + "/" + cell(r["rounds_failed"], "d")
        lines.append(
            f"{r['strategy']:<16.16} {cell(r['compute_utilization'], '.3f'):>5} {cf:>7} "
            f"{cell(r['wait_per_round_s'], '.2f'):>7} {_mb(r['bytes_sent_per_peer']):>7} "
            f"{cell(r['final_val_loss'], '.3f'):>6} {same:>4} {cell(r['wall_s'], '.0f'):>5}"
        )
        if r["rc"] != 0:
            lines.append(f"  ({r['strategy']}: simulate exited {r['rc']})")
    if summary:
        lines.append("utilization over the runs: median (range)")
        for e in summary:
            lo, hi = e["compute_utilization_range"] or (None, None)
            lines.append(
                f"  {e['strategy']:<16.16} {cell(e['compute_utilization'], '.3f')} "
                f"({cell(lo, '.3f')}-{cell(hi, '.3f')}), {e['runs']} runs, {e['runs_failed']} failed"
            )
    return lines


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    rows = doc["summary"]
    xs = list(range(len(rows)))
    util = [r["compute_utilization"] or 0.0 for r in rows]
    spans = [r["compute_utilization_range"] or [u, u] for r, u in zip(rows, util, strict=True)]
    err = [
        [u - lo for u, (lo, _) in zip(util, spans, strict=True)],
        [hi - u for u, (_, hi) in zip(util, spans, strict=True)],
    ]
    fig, ax = plt.subplots(figsize=(7.0, 4.5))
    bars = ax.bar(xs, util, 0.6, color="tab:green", yerr=err, capsize=3)
    for b, r in zip(bars, rows, strict=True):
        mb = (r["bytes_sent_per_peer"] or 0.0) / 1e6
        note = f"{mb:.1f} MB sent\nloss {r['final_val_loss'] or float('nan'):.3f}"
        ax.annotate(
            note, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=7
        )
    ax.set_xticks(xs, [r["strategy"] for r in rows])
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("compute utilization")
    s = doc["settings"]
    title = f"{s['peers']} peers in 3 regions (80-150 ms, 50 Mbit/s), {s['steps']} steps"
    ax.set_title(f"{title}, median of {s['runs']} runs (range)", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def _strategies(text: str) -> list[str]:
    return strategy_list(text, STRATEGIES)


def _run_one(strategy: str, steps: int, inner: int | None, tmp: Path, timeout: float) -> tuple[str, dict]:
    path = tmp / f"{strategy}.json"
    cmd = command(strategy, steps, path, inner)
    shown = " ".join(["swarmtrain", *cmd[len(SW) :]]).replace(str(path), "OUT.json")
    print(f"[{strategy}] {shown}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=dict(os.environ), timeout=timeout, capture_output=True, text=True
        )
        rc = proc.returncode
        if rc != 0:
            sys.stderr.write(proc.stderr[-2000:])
    except subprocess.TimeoutExpired:
        rc = 124
    doc = json.loads(path.read_text()) if path.exists() else None
    return shown, row(strategy, doc, rc, time.monotonic() - t0)


def main(argv: list[str] | None = None) -> int:
    """Run ``swarmtrain simulate --topology`` per strategy; write the JSON and PNG; print the table.

    Returns 0 when every run exited 0, else 1 (the rows and files are written either way); 2 when
    not root (the regions need network namespaces).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None, help=f"local steps per peer (default {STEPS})")
    ap.add_argument("-H", "--inner-steps", type=int, default=None, help="DiLoCo/Streaming H (default theirs)")
    ap.add_argument("--strategies", type=_strategies, default=None, help=f"of {', '.join(STRATEGIES)} (all)")
    ap.add_argument(
        "--json", type=Path, default=None, help="output JSON (default results/wan_utilization.json)"
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per strategy's command")
    ap.add_argument("--runs", type=int, default=None, help="runs of every strategy (default 3; --quick 1)")
    ap.add_argument(
        "--quick", action="store_true", help="smoke test: data_parallel and diloco, 20 steps, H=10"
    )
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("error: the emulated regions need root (network namespaces, tc)", file=sys.stderr)
        return 2
    runs = args.runs or (1 if args.quick else 3)
    if runs < 1:
        print("error: --runs must be >= 1", file=sys.stderr)
        return 2
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    inner = args.inner_steps or (QUICK_H if args.quick else None)
    strategies = args.strategies or list(QUICK_STRATEGIES if args.quick else STRATEGIES)
    out = args.json or (
        Path(tempfile.gettempdir()) / "wan_utilization_quick.json"
        if args.quick
        else RESULTS / "wan_utilization.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, commands = [], []
    with tempfile.TemporaryDirectory(prefix="wan-util-") as tmp:
        for run in range(runs):
            for strategy in strategies:
                shown, r = _run_one(strategy, steps, inner, Path(tmp), args.timeout)
                if run == 0:
                    commands.append(shown)
                rows.append({"run": run, **r})
    summary = summarize(rows)
    doc_out = {
        "benchmark": "wan_utilization",
        "recorded": recorded(),
        "settings": {
            "peers": PEERS,
            "steps": steps,
            "inner_steps": inner,
            "topology": str(TOPOLOGY.relative_to(ROOT)),
            "quick": args.quick,
            "strategies": strategies,
            "runs": runs,
            "cpus": os.cpu_count(),
        },
        "commands": commands,
        "summary": summary,
        "rows": rows,
    }
    write_report(out, doc_out, table_lines(rows, summary), plot=_plot)
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
