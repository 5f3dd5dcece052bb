"""DiLoCo (Douillard et al. 2023, arXiv:2311.08105): final validation loss vs ledger bytes, against
fp32 DataParallel, at equal tokens over real peers.

Every row trains the ``tiny`` byte-level GPT with N real peer processes on 127.0.0.1
(``swarmtrain.simulation.runner.run_simulation``: hivemind DHT + P2P streams, byte ledger) with the same
steps, batch, seed, learning-rate schedule and data; only the strategy, the pseudo-gradient codec
(``none`` = fp32, ``int8``, ``ternary``) and H (inner steps between outer steps) change. Reported per
row: final validation loss (mean over peers) and its gap to DataParallel's from the same invocation,
ledger bytes sent per token per peer and the reduction factor vs DataParallel, whether all peers
ended bit-identical, and wall time. With S steps, DiLoCo at H makes only S // H outer steps (e.g.
S = 300, H = 100: 3 outer steps); the table says so for each row.

Rows are run in a fixed priority order (DataParallel first: every comparison needs it) and the JSON
is rewritten after each row, so an interrupted grid keeps what it measured; ``--resume`` runs only the
rows missing from an existing JSON made with the same settings.

Usage::

    python benchmarks/diloco.py                      # 4 peers, 300 steps, full grid (10 runs)
    python benchmarks/diloco.py --only dp,none-10,int8-50 --steps 200
    python benchmarks/diloco.py --quick              # smoke test: 2 peers, 20 steps, H=10 rows
    python benchmarks/diloco.py --render             # re-print table and PNG from the JSON

Writes ``benchmarks/results/diloco.json`` and ``diloco.png`` (loss vs bytes/token, log x).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["RunSpec", "grid", "shared_settings", "select", "add_comparisons", "format_table", "main"]

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import RESULTS, pyplot, save_figure, write_json, write_report  # noqa: E402

CODECS = ("none", "int8", "ternary")
HS = (10, 50, 100)


class RunSpec:
    """One row: a key for ``--only`` (``dp`` or ``<codec>-<H>``) and its config overrides."""

    def __init__(self, key: str, strategy: str, codec: str, h: int | None) -> None:
        self.key = key
        self.strategy = strategy
        self.codec = codec
        self.h = h

    def overrides(self) -> dict[str, Any]:
        """Config overrides of this row (on top of ``shared_settings``)."""
        o: dict[str, Any] = {"strategy.name": self.strategy, "compression.codec": self.codec}
        if self.h is not None:
            o["strategy.inner_steps"] = self.h
        return o


def grid() -> list[RunSpec]:
    """All rows, in the order they are run (most informative first, so a cut-short grid still
    compares DataParallel with each codec and each H)."""
    order = [("none", 10), ("none", 50), ("int8", 50), ("ternary", 50), ("none", 100)]
    order += [(c, h) for h in HS for c in CODECS if (c, h) not in order]
    return [RunSpec("dp", "data_parallel", "none", None)] + [
        RunSpec(f"{c}-{h}", "diloco", c, h) for c, h in order
    ]


def select(specs: list[RunSpec], only: str | None) -> list[RunSpec]:
    """The rows named in ``only`` (comma-separated keys, ``fp32`` accepted for ``none``), grid order.

    Raises:
        SystemExit: an unknown key.
    """
    if not only:
        return specs
    keys = {k.strip().replace("fp32", "none") for k in only.split(",") if k.strip()}
    known = {s.key for s in specs}
    bad = sorted(keys - known)
    if bad:
        raise SystemExit(f"unknown --only keys {bad}; known: {sorted(known)}")
    return [s for s in specs if s.key in keys]


def shared_settings(steps: int, peers: int, quick: bool) -> dict[str, Any]:
    """Config overrides shared by every row: same steps, batch, seed, schedule and data."""
    return {
        "model.preset": "tiny",
        "train.steps": steps,
        "train.batch_size": 16,
        "train.seed": 0,
        "train.lr": 1e-3,
        "train.min_lr": 1e-4,
        "train.warmup_steps": 2 if quick else 20,
        "train.eval_interval": 100_000,  # evaluate once, at the end
        "train.eval_batches": 4 if quick else 16,
        "train.log_interval": 10,
        "peers.min_peers": peers,
        "peers.join_window": 3.0,
        "strategy.sync_timeout": 120.0,
    }


def _row(spec: RunSpec, cfg: Any, res: Any) -> dict[str, Any]:
    s: dict[str, Any] = res.summary()
    s["key"] = spec.key
    s["inner_steps"] = spec.h
    s["outer_steps_planned"] = None if spec.h is None else res.steps // spec.h
    s["bytes_sent_per_peer_per_step"] = res.bytes_sent_per_peer / max(res.steps, 1)
    s["committed_rounds"] = [o.committed_rounds for o in res.outcomes]
    s["failed_rounds"] = [o.failed_rounds for o in res.outcomes]
    s["peer_val_losses"] = [o.final_val_loss for o in res.outcomes]
    s["strategy_options"] = cfg.strategy.model_dump()
    s["compression_options"] = cfg.compression.model_dump()
    return s


def add_comparisons(rows: list[dict[str, Any]]) -> None:
    """Set ``loss_vs_dp`` (relative gap) and ``bytes_reduction_vs_dp`` on every row, from the
    DataParallel row of the same document (None when it has none)."""
    dp = next((r for r in rows if r["strategy"] == "data_parallel"), None)
    for r in rows:
        if dp is None:
            r["loss_vs_dp"] = r["bytes_reduction_vs_dp"] = None
            continue
        r["loss_vs_dp"] = r["final_val_loss"] / dp["final_val_loss"] - 1.0
        r["bytes_reduction_vs_dp"] = dp["bytes_per_token"] / max(r["bytes_per_token"], 1e-12)


def _codec_name(codec: str) -> str:
    return "fp32" if codec == "none" else codec


def format_table(doc: dict[str, Any]) -> str:
    """The results table (one line per row, then notes on what was and was not run)."""
    head = (
        f"{'strategy':<15}{'codec':<9}{'H':>5}{'outer':>7}{'val loss':>10}{'vs DP':>9}"
        f"{'B/token/peer':>14}{'reduction':>11}{'ident':>7}{'wall s':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in doc["rows"]:
        h = "-" if r["inner_steps"] is None else str(r["inner_steps"])
        committed = min(r.get("committed_rounds") or [0])
        outer = "-" if r["outer_steps_planned"] is None else f"{committed}/{r['outer_steps_planned']}"
        gap = "n/a" if r.get("loss_vs_dp") is None else f"{r['loss_vs_dp']:+.2%}"
        red = "n/a" if r.get("bytes_reduction_vs_dp") is None else f"{r['bytes_reduction_vs_dp']:,.0f}x"
        lines.append(
            f"{r['strategy']:<15}{_codec_name(r['compressor']):<9}{h:>5}{outer:>7}"
            f"{r['final_val_loss']:>10.4f}{gap:>9}{r['bytes_per_token']:>14,.2f}{red:>11}"
            f"{'yes' if r['params_identical'] else 'NO':>7}{r['wall_s']:>8.0f}"
        )
    s = doc["shared_settings"]
    lines.append("")
    lines.append(
        f"{doc['peers']} peers, {s['train.steps']} steps of batch {s['train.batch_size']} per peer, "
        f"seed {s['train.seed']}, equal tokens for every row; 'outer' = outer steps committed by every "
        "peer / planned (steps // H)."
    )
    failed = [
        f"{r['key']}: {sum(r['failed_rounds'])}" for r in doc["rows"] if sum(r.get("failed_rounds") or [0])
    ]
    if failed:
        lines.append(f"Failed (uncommitted) rounds, summed over peers: {', '.join(failed)}")
    few = [r for r in doc["rows"] if r["outer_steps_planned"] is not None and r["outer_steps_planned"] < 5]
    if few:
        hs = sorted({r["inner_steps"] for r in few})
        lines.append(
            f"Note: H in {hs} gets fewer than 5 outer steps in this run; its loss gap reflects a short "
            "run, not DiLoCo's asymptote (the gap shrinks as outer steps grow)."
        )
    missing = doc.get("not_run", [])
    if missing:
        lines.append(f"Not run in this invocation: {', '.join(missing)}")
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    colors = {"none": "tab:blue", "int8": "tab:orange", "ternary": "tab:green"}
    fig, ax = plt.subplots(figsize=(7.0, 4.5))
    for r in doc["rows"]:
        dp = r["strategy"] == "data_parallel"
        label = "DataParallel fp32" if dp else f"DiLoCo {_codec_name(r['compressor'])} H={r['inner_steps']}"
        ax.scatter(
            r["bytes_per_token"],
            r["final_val_loss"],
            s=70,
            marker="s" if dp else "o",
            color="black" if dp else colors.get(r["compressor"], "gray"),
        )
        ax.annotate(
            label,
            (r["bytes_per_token"], r["final_val_loss"]),
            textcoords="offset points",
            xytext=(6, 4),
            fontsize=7,
        )
    ax.set_xscale("log")
    xs = [r["bytes_per_token"] for r in doc["rows"] if r["bytes_per_token"] > 0]
    if xs:
        ax.set_xlim(min(xs) / 2, max(xs) * 4)  # room for the labels right of the points
    ax.set_xlabel("ledger bytes sent per token (per peer, log)")
    ax.set_ylabel("final validation loss")
    s = doc["shared_settings"]
    ax.set_title(f"tiny GPT, {doc['peers']} peers, {s['train.steps']} steps each, equal tokens", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def _write(doc: dict[str, Any], out: Path) -> None:
    add_comparisons(doc["rows"])
    done = {r["key"] for r in doc["rows"]}
    doc["not_run"] = [s.key for s in grid() if s.key not in done]
    tmp = out.with_suffix(".json.tmp")
    write_json(tmp, doc)
    tmp.replace(out)


def _run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from swarmtrain.core.config import load_config
    from swarmtrain.simulation.runner import run_simulation

    shared = shared_settings(args.steps, args.peers, args.quick)
    doc: dict[str, Any] = {
        "benchmark": "diloco",
        "quick": args.quick,
        "peers": args.peers,
        "shared_settings": shared,
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "rows": [],
    }
    if args.resume and out.exists():
        old = json.loads(out.read_text())
        if old.get("shared_settings") != shared or old.get("peers") != args.peers:
            raise SystemExit(f"--resume: {out} was made with other settings")
        doc["rows"] = old["rows"]
    done = {r["key"] for r in doc["rows"]}
    for spec in select(grid(), args.only):
        if spec.key in done:
            continue
        cfg = load_config(None, {**shared, **spec.overrides()}, env={})
        t0 = time.perf_counter()
        print(f"[{time.strftime('%H:%M:%S')}] running {spec.key} ...", flush=True)
        res = run_simulation(cfg, args.peers, timeout=args.timeout)
        doc["rows"].append(_row(spec, cfg, res))
        order = [s.key for s in grid()]
        doc["rows"].sort(key=lambda r: order.index(r["key"]))
        _write(doc, out)  # keep every finished row even if a later one fails
        print(
            f"  {spec.key}: loss {res.final_val_loss:.4f}, {res.bytes_per_token:,.2f} B/token, "
            f"{time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    _write(doc, out)
    return doc


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run the selected rows (or re-render), print the table, write JSON and PNG."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="steps per peer for every row (default 300)")
    ap.add_argument("--peers", type=int, default=None, help="peer processes (default 4)")
    ap.add_argument("--only", default=None, help="comma-separated rows: dp, none-10, int8-50, ternary-100...")
    ap.add_argument("--quick", action="store_true", help="2 peers, 20 steps, dp and H=10 rows: a smoke test")
    ap.add_argument("--resume", action="store_true", help="skip rows already in the JSON (same settings)")
    ap.add_argument("--render", action="store_true", help="only re-print the table and PNG from the JSON")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (PNG beside it)")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps = args.steps or 20
        args.peers = args.peers or 2
        args.only = args.only or "dp,none-10,int8-10,ternary-10"
    args.steps = args.steps or 300
    args.peers = args.peers or 4
    if args.steps < 1 or args.peers < 1:
        ap.error("--steps and --peers must be >= 1")
    logging.basicConfig(level=logging.WARNING)
    out = args.out or RESULTS / ("diloco_quick.json" if args.quick else "diloco.json")
    if args.render:
        doc = json.loads(out.read_text())
        add_comparisons(doc["rows"])
    else:
        doc = _run(args, out)
    write_report(out, doc, format_table(doc), plot=_plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
