"""Chaos per strategy (issue 14, point 7): val loss with chaos against without, and rounds lost.

For each strategy this runs the user's own command as a subprocess::

    swarmtrain simulate --peers N --strategy S --steps T --chaos SPEC --json PATH

which makes a clean run and then the same configuration under chaos (random SIGKILLs and SIGTERMs,
each peer restarted with the same identity), and writes ``kills``, ``preemptions``, ``restarts``,
``rounds_committed`` / ``rounds_failed`` (and the clean run's ``clean_rounds_*``),
``params_identical``, ``final_val_loss`` and ``clean_val_loss``. This script collects one row per
strategy: the faults, the rounds committed and failed clean vs chaos, the loss under chaos against
the clean loss (and their ratio), whether the peers agree at the end, the exit code and the wall time.
For ``swarm`` (``--stages 2``), ``--peers`` are stage servers (the chaos hits those; one trainer
feeds ``--steps`` micro-batches), its rounds are the stages' optimizer steps and "identical" means
each stage's replicas.

Usage::

    python benchmarks/chaos.py                          # 4 peers x 200 steps, every strategy
    python benchmarks/chaos.py --strategies diloco,data_parallel --chaos kill=2/min,restart=15s
    python benchmarks/chaos.py --quick --json /tmp/c.json   # smoke test: 3 peers, 60 steps, fast chaos

Writes ``benchmarks/results/chaos.json`` and ``chaos.png`` (bar chart of the loss clean vs chaos per
strategy), or ``--json PATH`` and the PNG beside it, and prints an 80-column table. A fault never
leaves fewer than 2 running peers (``swarmtrain.simulation.chaos``), so ``--peers`` must be >= 3 for
any fault to land.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import (  # noqa: E402
    RESULTS,
    cell,
    error_line,
    number,
    pyplot,
    recorded,
    save_figure,
    strategy_list,
    write_report,
)

__all__ = [
    "STRATEGIES",
    "DEFAULT_CHAOS",
    "QUICK_CHAOS",
    "command",
    "row",
    "table_lines",
    "markdown_table",
    "main",
]

#: strategies the benchmark knows, all run by default
STRATEGIES = ("diloco", "streaming_diloco", "demo", "data_parallel", "swarm")
DEFAULT_STRATEGIES = STRATEGIES
#: twice the Done-when rate, with preemptions: a 4-peer DiLoCo run of 200 steps sees about 4 faults
DEFAULT_CHAOS = "kill=4/min,preempt=2/min,restart=15s,seed=1"
#: --quick: a fault every 5 s once training starts, so at least one lands before the quiet last quarter
QUICK_CHAOS = "kill=12/min,restart=3s,seed=1"
QUICK = {"peers": 3, "steps": 60, "inner_steps": 10, "batch_size": 8}
#: strategies that take ``-H`` (DiLoCo's H; Streaming DiLoCo's too)
TAKES_H = ("diloco", "streaming_diloco")
#: SWARM's pipeline: ``--peers`` stage servers over this many stages, one trainer feeding ``--steps``
#: micro-batches; its rounds are the stages' optimizer steps (the replicas' gradient averages)
SWARM_STAGES = 2
SW = [sys.executable, "-m", "swarmtrain"]


def command(
    strategy: str,
    peers: int,
    steps: int,
    chaos: str,
    json_path: Path,
    inner_steps: int | None = None,
    batch_size: int | None = None,
) -> list[str]:
    """The ``swarmtrain simulate`` command line of one strategy's run."""
    cmd = [
        *SW,
        "simulate",
        "--peers",
        str(peers),
        "--strategy",
        strategy,
        "--steps",
        str(steps),
        "--chaos",
        chaos,
        "--json",
        str(json_path),
    ]
    if inner_steps is not None and strategy in TAKES_H:
        cmd += ["-H", str(inner_steps)]
    if strategy == "swarm":
        cmd += ["--stages", str(SWARM_STAGES)]
    if batch_size is not None:
        cmd += ["--batch-size", str(batch_size)]
    return cmd


def row(strategy: str, chaos: str, doc: dict[str, Any] | None, rc: int, wall_s: float) -> dict[str, Any]:
    """One strategy's row from the simulate JSON (``doc``; ``None`` when it wrote none)."""
    d = doc or {}
    final, clean = number(d.get("final_val_loss")), number(d.get("clean_val_loss"))
    ratio = final / clean if final is not None and clean else None
    return {
        "strategy": strategy,
        "compressor": d.get("compressor"),
        "chaos": d.get("chaos", chaos),
        "rc": rc,
        "kills": d.get("kills"),
        "preemptions": d.get("preemptions"),
        "restarts": d.get("restarts"),
        "deaths": d.get("deaths"),
        "missing_ranks": d.get("missing_ranks"),
        "rounds_committed": d.get("rounds_committed"),
        "rounds_failed": d.get("rounds_failed"),
        "clean_rounds_committed": d.get("clean_rounds_committed"),
        "clean_rounds_failed": d.get("clean_rounds_failed"),
        "final_val_loss": final,
        "clean_val_loss": clean,
        "loss_ratio": ratio,
        "params_identical": d.get("params_identical"),
        "wall_s": round(wall_s, 1),  # the whole command: the clean run and the chaos run
        "timeline": d.get("timeline", []),
    }


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as a table of at most 80 columns (c/f: rounds committed/failed; same: the peers' parameters
    identical at the end; wall: seconds of the whole command, clean run and chaos run)."""
    head = (
        f"{'strategy':<16} {'kill':>4} {'pre':>3} {'rst':>3} {'chaos c/f':>9} {'clean c/f':>9} "
        f"{'loss':>6} {'clean':>6} {'ratio':>5} {'same':>4} {'wall':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        same = {True: "yes", False: "NO"}.get(r["params_identical"], "-")
        lines.append(
            f"{r['strategy']:<16.16} {cell(r['kills'], '4d')} {cell(r['preemptions'], '3d')} "
            f"{cell(r['restarts'], '3d')} "
            f"{cell(r['rounds_committed'], 'd') + '/' + cell(r['rounds_failed'], 'd'):>9} "
            f"{cell(r['clean_rounds_committed'], 'd') + '/' + cell(r['clean_rounds_failed'], 'd'):>9} "
            f"{cell(r['final_val_loss'], '6.3f')} {cell(r['clean_val_loss'], '6.3f')} "
            f"{cell(r['loss_ratio'], '5.3f')} {same:>4} {cell(r['wall_s'], '5.0f')}"
        )
        if r["rc"] != 0:
            lines.append(f"  ({r['strategy']}: simulate exited {r['rc']})")
    return lines


def markdown_table(doc: dict[str, Any]) -> str:
    """The README's table of ``doc`` (this script's JSON): one row per strategy; a run that wrote no
    figures says so and how simulate exited."""
    lines = [
        "| strategy | kills | preempted | restarts | rounds c/f, chaos | c/f, clean "
        "| val loss, chaos | clean | identical |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in doc["rows"]:
        if r["final_val_loss"] is None:
            lines.append(
                f"| {r['strategy']} | – | – | – | – | – | – | – | no result: simulate exited {r['rc']} |"
            )
            continue
        same = {True: "yes", False: "**no**"}.get(r["params_identical"], "–")
        lines.append(
            f"| {r['strategy']} | {r['kills']} | {r['preemptions']} | {r['restarts']} "
            f"| {r['rounds_committed']}/{r['rounds_failed']} "
            f"| {r['clean_rounds_committed']}/{r['clean_rounds_failed']} "
            f"| {r['final_val_loss']:.4f} | {r['clean_val_loss']:.4f} | {same} |"
        )
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    rows = doc["rows"]
    xs = list(range(len(rows)))
    w = 0.38
    clean = [r["clean_val_loss"] or 0.0 for r in rows]
    chaos = [r["final_val_loss"] or 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(7.0, 4.5))
    ax.bar([x - w / 2 for x in xs], clean, w, label="clean", color="tab:blue")
    bars = ax.bar([x + w / 2 for x in xs], chaos, w, label="chaos", color="tab:red")
    for b, r in zip(bars, rows, strict=True):
        faults = f"{r['kills'] or 0}k {r['preemptions'] or 0}p"
        faults += "" if r["params_identical"] else "\nNOT identical"
        ax.annotate(
            faults, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=7
        )
    ax.set_xticks(xs, [r["strategy"] for r in rows])
    lows = [v for v in clean + chaos if v > 0]
    if lows:
        ax.set_ylim(min(lows) * 0.95, max(lows) * 1.03)
    for x, r in zip(xs, rows, strict=True):
        if r["final_val_loss"] is None and r["clean_val_loss"] is None:  # simulate wrote no JSON
            y = ax.get_ylim()[0] + 0.5 * (ax.get_ylim()[1] - ax.get_ylim()[0])
            ax.annotate(f"no result\n(simulate exited {r['rc']})", (x, y), ha="center", fontsize=8)
    ax.set_ylabel("final validation loss")
    s = doc["settings"]
    ax.set_title(f"{s['peers']} peers x {s['steps']} steps, chaos {s['chaos']}", fontsize=9)
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def _strategies(text: str) -> list[str]:
    return strategy_list(text, STRATEGIES)


def main(argv: list[str] | None = None) -> int:
    """Run ``swarmtrain simulate --chaos`` per strategy; write the JSON and PNG; print the table.

    Returns 0 when every run exited 0, else 1 (the rows and files are written either way).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", type=int, default=None, help="training peers (default 4; --quick 3)")
    ap.add_argument("--steps", type=int, default=None, help="local steps per peer (default 200; --quick 60)")
    ap.add_argument("--chaos", default=None, help=f"chaos spec (default {DEFAULT_CHAOS!r})")
    ap.add_argument(
        "--strategies",
        type=_strategies,
        default=list(DEFAULT_STRATEGIES),
        help=f"comma-separated, of {', '.join(STRATEGIES)} (default {','.join(DEFAULT_STRATEGIES)})",
    )
    ap.add_argument("--json", type=Path, default=None, help="output JSON (default results/chaos.json)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per strategy's command")
    ap.add_argument("--quick", action="store_true", help="smoke test: 3 peers, 60 steps, a fault every 5 s")
    args = ap.parse_args(argv)

    peers = args.peers or (QUICK["peers"] if args.quick else 4)
    steps = args.steps or (QUICK["steps"] if args.quick else 200)
    chaos = args.chaos or (QUICK_CHAOS if args.quick else DEFAULT_CHAOS)
    inner = QUICK["inner_steps"] if args.quick else None
    batch = QUICK["batch_size"] if args.quick else None
    out = args.json or (
        Path(tempfile.gettempdir()) / "chaos_quick.json" if args.quick else RESULTS / "chaos.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    commands = []
    with tempfile.TemporaryDirectory(prefix="chaos-bench-") as tmp:
        for strategy in args.strategies:
            path = Path(tmp) / f"{strategy}.json"
            cmd = command(strategy, peers, steps, chaos, path, inner, batch)
            commands.append(" ".join(["swarmtrain", *cmd[len(SW) :]]).replace(str(path), "OUT.json"))
            print(f"[{strategy}] {commands[-1]}", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            error = None
            try:
                proc = subprocess.run(
                    cmd, env=dict(os.environ), timeout=args.timeout, capture_output=True, text=True
                )
                rc = proc.returncode
                if rc != 0:
                    sys.stderr.write(proc.stderr[-2000:])
                    error = error_line(proc.stderr)
            except subprocess.TimeoutExpired:
                rc, error = 124, f"timed out after {args.timeout:.0f} s"
            wall = time.monotonic() - t0
            doc = json.loads(path.read_text()) if path.exists() else None
            rows.append({**row(strategy, chaos, doc, rc, wall), "error": error})
    doc_out = {
        "benchmark": "chaos",
        "recorded": recorded(),
        "settings": {
            "peers": peers,
            "steps": steps,
            "chaos": chaos,
            "inner_steps": inner,
            "batch_size": batch,
            "quick": args.quick,
            "strategies": args.strategies,
            "cpus": os.cpu_count(),
        },
        "commands": commands,
        "rows": rows,
    }
    write_report(out, doc_out, table_lines(rows), plot=_plot)
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
