"""Scale (issue 35, point 3): what a run costs per peer as the peers grow, at a fixed token budget.

For each codec and peer count this runs the user's own command as a subprocess::

    swarmtrain simulate --peers N --compressor C --steps S -H H --batch-size B --json PATH

with ``S`` chosen so that the N peers together train on the same number of tokens at every N (the
budget; at least ``2 H`` steps, so every run has two rounds). One row per run: memory per peer
(``rss_per_peer_mib``: PSS of each rank's process tree, its peak, averaged over the ranks) and of
the whole run (``peak_rss_total_mib``), seconds per round (the run's wall time over its rounds),
bytes sent per peer, the final validation loss, whether the peers ended identical, the exit code.

Usage::

    python benchmarks/scale.py                          # 4, 8, 16, 32, 64 peers; int8 and ternary
    python benchmarks/scale.py --peers 4,8,16 --codecs int8
    python benchmarks/scale.py --quick --json /tmp/s.json   # smoke test: 2 and 3 peers, a small budget

Writes ``benchmarks/results/scale.json`` and ``scale.png`` (memory per peer and seconds per round
against the peers), or ``--json PATH`` and the PNG beside it, and prints an 80-column table. A run
that fails (too little memory for its peers, a timeout) is a row with its exit code and error line;
the others go on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import RESULTS, cell, error_line, number, pyplot, recorded, save_figure, write_report  # noqa: E402

__all__ = ["PEERS", "CODECS", "QUICK", "steps_for", "command", "row", "table_lines", "markdown_table", "main"]

PEERS = (4, 8, 16, 32, 64)
CODECS = ("int8", "ternary")
#: the default run: tokens all peers train on together, DiLoCo's H, the micro-batch, the block size
#: (the tiny preset's)
DEFAULT = {"tokens": 64 * 60 * 16 * 128, "inner_steps": 10, "batch_size": 16}
QUICK = {"peers": (2, 3), "tokens": 3 * 10 * 8 * 128, "inner_steps": 5, "batch_size": 8}
BLOCK = 128
SW = [sys.executable, "-m", "swarmtrain"]


def steps_for(tokens: int, peers: int, batch_size: int, inner_steps: int) -> int:
    """Local steps per peer so ``peers`` peers train on ``tokens`` together (a whole number of rounds
    of ``inner_steps``, at least two)."""
    per_peer = tokens // (peers * batch_size * BLOCK)
    return max(2, per_peer // inner_steps) * inner_steps


def command(peers: int, codec: str, steps: int, inner_steps: int, batch_size: int, out: Path) -> list[str]:
    """The ``swarmtrain simulate`` command line of one point."""
    return [
        *SW, "simulate", "--peers", str(peers), "--compressor", codec, "--steps", str(steps),
        "-H", str(inner_steps), "--batch-size", str(batch_size), "--json", str(out),
    ]  # fmt: skip


def row(
    peers: int, codec: str, steps: int, doc: dict[str, Any] | None, rc: int, wall_s: float
) -> dict[str, Any]:
    """One point's row from the simulate JSON (``doc``; ``None`` when it wrote none)."""
    d = doc or {}
    rounds = number(d.get("rounds_committed"))
    sim_wall = number(d.get("wall_s"))
    return {
        "peers": peers,
        "codec": codec,
        "steps_per_peer": steps,
        "tokens": d.get("tokens"),
        "rc": rc,
        "rss_per_peer_mib": number(d.get("rss_per_peer_mib")),
        "peak_rss_total_mib": number(d.get("peak_rss_total_mib")),
        "rounds_committed": rounds,
        "rounds_failed": number(d.get("rounds_failed")),
        "s_per_round": sim_wall / rounds if sim_wall is not None and rounds else None,
        # what a peer's training loop waited per round (the round itself, not the steps between)
        "wait_per_round_s": number(d.get("wait_per_round_s")),
        "bytes_sent_per_peer": number(d.get("bytes_sent_per_peer")),
        "final_val_loss": number(d.get("final_val_loss")),
        "params_identical": d.get("params_identical"),
        "wall_s": round(wall_s, 1),  # the whole command (the run and its start)
    }


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as a table of at most 80 columns (MiB/peer: PSS of a peer's process tree; total:
    the whole run's; s/round: the run's wall time, start included, over its rounds; wait/rnd: what
    a training loop waited per round; same: identical at the end)."""
    head = (
        f"{'peers':>5} {'codec':<7} {'steps':>5} {'MiB/peer':>8} {'total MiB':>9} {'s/round':>7} "
        f"{'wait/rnd':>8} {'MiB sent':>8} {'val loss':>8} {'same':>4}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        same = {True: "yes", False: "NO"}.get(r["params_identical"], "-")
        sent = r["bytes_sent_per_peer"] / (1 << 20) if r["bytes_sent_per_peer"] is not None else None
        lines.append(
            f"{r['peers']:>5} {r['codec']:<7.7} {r['steps_per_peer']:>5} "
            f"{cell(r['rss_per_peer_mib'], '8.0f')} {cell(r['peak_rss_total_mib'], '9.0f')} "
            f"{cell(r['s_per_round'], '7.2f')} {cell(r['wait_per_round_s'], '8.2f')} {cell(sent, '8.1f')} "
            f"{cell(r['final_val_loss'], '8.4f')} {same:>4}"
        )
        if r["rc"] != 0:
            lines.append(f"  ({r['peers']} peers {r['codec']}: simulate exited {r['rc']}: {r.get('error')})")
    return lines


def markdown_table(doc: dict[str, Any]) -> str:
    """The docs' table of ``doc`` (this script's JSON): one row per run; a run that wrote no figures
    says how simulate exited."""
    lines = [
        "| peers | codec | steps/peer | tokens | MiB/peer (PSS) | run MiB | rounds ok/failed "
        "| s/round | wait/round s | MiB sent/peer | val loss | identical |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in doc["rows"]:
        if r["final_val_loss"] is None:
            gaps = " | ".join(["–"] * 8)
            lines.append(
                f"| {r['peers']} | {r['codec']} | {r['steps_per_peer']} | {gaps} "
                f"| no result: simulate exited {r['rc']} |"
            )
            continue
        same = {True: "yes", False: "**no**"}.get(r["params_identical"], "–")
        lines.append(
            f"| {r['peers']} | {r['codec']} | {r['steps_per_peer']} | {r['tokens']:,} "
            f"| {r['rss_per_peer_mib']:.0f} | {r['peak_rss_total_mib']:,.0f} "
            f"| {cell(r['rounds_committed'], '.0f')}/{cell(r['rounds_failed'], '.0f')} "
            f"| {cell(r['s_per_round'], '.1f')} | {cell(r['wait_per_round_s'], '.2f')} "
            f"| {r['bytes_sent_per_peer'] / (1 << 20):.1f} | {r['final_val_loss']:.4f} | {same} |"
        )
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 4.0))
    for codec in doc["settings"]["codecs"]:
        pts = [r for r in doc["rows"] if r["codec"] == codec and r["rss_per_peer_mib"] is not None]
        xs = [r["peers"] for r in pts]
        left.plot(xs, [r["rss_per_peer_mib"] for r in pts], marker="o", label=codec)
        right.plot(xs, [r["s_per_round"] or float("nan") for r in pts], marker="o", label=codec)
    for ax, label in ((left, "memory per peer, MiB (PSS)"), (right, "seconds per round")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("peers")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    s = doc["settings"]
    fig.suptitle(f"{s['tokens']:,} tokens in all, H={s['inner_steps']}, batch {s['batch_size']}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of peer counts: {text!r}") from None
    if not out or min(out) < 1 or max(out) > 64:
        raise argparse.ArgumentTypeError(f"peer counts must be 1-64: {text!r}")
    return out


def _codecs(text: str) -> tuple[str, ...]:
    from compression import CODECS as KNOWN

    out = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [c for c in out if c not in KNOWN]
    if not out or bad:
        raise argparse.ArgumentTypeError(f"unknown codec(s) {bad or text!r}; known: {', '.join(KNOWN)}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run ``swarmtrain simulate`` per codec and peer count; write the JSON and PNG; print the table.

    Returns 0 when every run exited 0, else 1 (the rows and files are written either way).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peers", type=_ints, default=None, help="comma-separated (default 4,8,16,32,64)")
    ap.add_argument("--codecs", type=_codecs, default=CODECS, help="comma-separated (default int8,ternary)")
    ap.add_argument(
        "--tokens", type=int, default=None, help=f"the token budget (default {DEFAULT['tokens']:,})"
    )
    ap.add_argument("--json", type=Path, default=None, help="output JSON (default results/scale.json)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 and 3 peers, a small budget")
    args = ap.parse_args(argv)

    base = QUICK if args.quick else DEFAULT
    peers = args.peers or (QUICK["peers"] if args.quick else PEERS)
    tokens, inner, batch = (
        args.tokens or int(base["tokens"]),
        int(base["inner_steps"]),
        int(base["batch_size"]),
    )
    out = args.json or (
        Path(tempfile.gettempdir()) / "scale_quick.json" if args.quick else RESULTS / "scale.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
        for codec in args.codecs:
            for n in peers:
                steps = steps_for(tokens, n, batch, inner)
                path = Path(tmp) / f"{codec}_{n}.json"
                print(f"{n} peers, {codec}, {steps} steps each ...", flush=True)
                t0 = time.monotonic()
                try:
                    proc = subprocess.run(
                        command(n, codec, steps, inner, batch, path),
                        capture_output=True,
                        text=True,
                        timeout=args.timeout,
                    )
                    rc, err = proc.returncode, error_line(proc.stderr) if proc.returncode else None
                except subprocess.TimeoutExpired:
                    rc, err = 124, f"timed out after {args.timeout:.0f} s"
                doc = json.loads(path.read_text()) if path.exists() else None
                rows.append({**row(n, codec, steps, doc, rc, time.monotonic() - t0), "error": err})
    doc = {
        "benchmark": "scale",
        "recorded": recorded(argv),
        "settings": {"peers": list(peers), "codecs": list(args.codecs), "tokens": tokens,
                     "inner_steps": inner, "batch_size": batch, "quick": args.quick},
        "rows": rows,
    }  # fmt: skip
    write_report(out, doc, table_lines(rows), plot=_plot)
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
