"""Byzantine-tolerant averaging benchmark (issue 6): final loss under attack vs the clean run.

Grid: n = 8 peers with f = 3 attackers and n = 16 with f = 7; every attack of
``swarmtrain.simulation.attacks`` x every reducer of ``peers.reducers``; DataParallel (peers send
gradients every step) and DiLoCo (peers send pseudo-gradients after H local Adam steps, outer
Nesterov). Each cell is one run of a tiny byte-level model on the stdlib's sources: ``n`` threads,
each running the real strategy (``optimizers.build_strategy``) on one member of an
``optimizers.inprocess.InProcessGroup``, with the real reducer and attacks
(``benchmarks/byzantine_sim.py``); its final validation loss is compared with the clean run (plain
mean, no attackers) of the same strategy, n, seed and data: ``ratio = loss / clean``.

A second, smaller "goal" grid repeats mean vs centered_clip with 7 of 16 attackers at a larger batch
(honest updates with a better signal-to-noise ratio, the regime of BTARD's experiments) and checks
the issue's goal: centered_clip within 5% of the clean run for sign flip, random direction, ALIE, IPM
and label flip, while the plain mean visibly fails (ratio > 1.2).

``--real-peers`` instead runs ``swarmtrain simulate`` (real peer processes over hivemind on
127.0.0.1, DiLoCo H=10, tiny byte-level GPT), one row per attack, merged into
``byzantine_real.json``: 3 peers with 1 attacker for sign flip, random direction, Gaussian noise,
stale, label flip (the attacker trains on flipped targets) and the malicious owner (with and without
the owner check, whose byte cost is the clean run with the check vs without); 5 peers with 2
colluding attackers for ALIE and IPM, which estimate the honest updates from the attackers' own
(shared over their side channel; see
``swarmtrain.simulation.attacks.collusion``). Each group has its own clean run;
``--real-groups`` picks the groups to (re)run.

Run: ``python benchmarks/byzantine.py`` (writes ``benchmarks/results/byzantine.{json,png}``);
``--quick`` runs a small smoke grid (written under ``byzantine_quick.*``); ``--sizes 16`` runs only
the n = 16 part of the main grid (the rest is then listed as not re-measured).
``--readme-table JSON`` prints the README's table (7 of 16, mean vs centered_clip) from a results JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from byzantine_sim import SimConfig, load_corpus, run_sim  # noqa: E402
from runlog import pyplot, recorded, save_figure, write_report  # noqa: E402

from peers.reducers import build_reducer  # noqa: E402
from swarmtrain.core.errors import ConfigError  # noqa: E402

REDUCERS = [
    "mean",
    "coordinate_median",
    "trimmed_mean",
    "centered_clip",
    "krum",
    "multi_krum",
    "geometric_median",
]
ATTACKS = [
    "sign_flip",
    "random_direction",
    "gaussian_noise",
    "label_flip",
    "alie",
    "ipm",
    "stale",
    "malicious_owner",
]
GOAL_ATTACKS = ["sign_flip", "random_direction", "alie", "ipm", "label_flip"]
GOAL_TOLERANCE = 0.05
MEAN_FAILS = 1.20

STRATEGIES: dict[str, dict[str, Any]] = {
    "data_parallel": {"rounds": 60, "inner_steps": 1, "lr": 3e-3},
    "diloco": {"rounds": 10, "inner_steps": 10, "lr": 3e-3, "outer_lr": 0.7, "outer_momentum": 0.9},
}
# Stale: replay updates from about a quarter of the run ago.
STALE_DELAY = {"data_parallel": 20, "diloco": 3}


def _run(
    strategy: str,
    n: int,
    f: int,
    attack: str,
    reducer: str,
    batch: int,
    corpus: torch.Tensor,
    rounds: int | None = None,
) -> dict[str, Any]:
    opts = dict(STRATEGIES[strategy])
    if rounds is not None:
        opts["rounds"] = rounds
    attack_options: tuple[tuple[str, float], ...] = ()
    if attack == "stale":
        attack_options = (("delay", STALE_DELAY[strategy]),)
    cfg = SimConfig(
        strategy=strategy,
        n_peers=n,
        n_attackers=f if attack != "none" else 0,
        attack=attack,
        batch=batch,
        attack_options=attack_options,
        **opts,
    )
    row: dict[str, Any] = {
        "strategy": strategy,
        "n": n,
        "f": cfg.n_attackers,
        "attack": attack,
        "reducer": reducer,
        "batch": batch,
    }
    # The mean is built for f = 0 on purpose: it shows what an unprotected run does under attack.
    # Krum needs n >= 2f + 3, so it refuses 3 of 8 and 7 of 16; it runs configured for the most it
    # accepts (2 of 8, 6 of 16) and faces one attacker more than it was built for ("tolerates").
    tolerate = 0 if reducer == "mean" else f
    while tolerate > 0 and n < build_reducer(reducer, 0).min_peers(tolerate):
        tolerate -= 1
    row["tolerates"] = tolerate
    t0 = time.perf_counter()
    try:
        red = build_reducer(reducer, tolerate)
        red.check(n)
    except ConfigError as e:
        row.update(loss=None, status=f"refused: {e}", seconds=0.0)
        return row
    row.update(run_sim(cfg, red, corpus))
    row["seconds"] = round(time.perf_counter() - t0, 2)
    return row


def _with_ratios(rows: list[dict[str, Any]]) -> None:
    clean = {
        (r["strategy"], r["n"], r["batch"]): r["loss"]
        for r in rows
        if r["attack"] == "none" and r["reducer"] == "mean"
    }
    for r in rows:
        base = clean.get((r["strategy"], r["n"], r["batch"]))
        r["clean_loss"] = base
        if r["loss"] is None or base is None:
            r["ratio"] = None
        else:
            r["ratio"] = r["loss"] / base if math.isfinite(r["loss"]) else math.inf


def _fmt(ratio: float | None, status: str) -> str:
    if status.startswith("refused"):
        return "refused"
    if ratio is None or not math.isfinite(ratio):
        return "diverged"
    return f"{ratio:.2f}" if ratio < 100 else f"{ratio:.0f}"


def _table(rows: list[dict[str, Any]], title: str) -> str:
    lines = [title]
    groups = sorted(
        {
            (r["strategy"], r["n"], r["f"] if r["attack"] != "none" else None, r["batch"])
            for r in rows
            if r["attack"] != "none"
        }
    )
    for strategy, n, f, batch in groups:
        sel = [r for r in rows if r["strategy"] == strategy and r["n"] == n and r["batch"] == batch]
        reds = [x for x in REDUCERS if any(r["reducer"] == x for r in sel)]
        clean = next(r["loss"] for r in sel if r["attack"] == "none" and r["reducer"] == "mean")
        lines.append(f"\n{strategy}, n={n}, f={f}, batch={batch}: loss / clean-mean loss ({clean:.3f})")
        lines.append(f"{'attack':<18}" + "".join(f"{x[:13]:>14}" for x in reds))
        for attack in ["none", *ATTACKS]:
            cells = {r["reducer"]: _fmt(r["ratio"], r["status"]) for r in sel if r["attack"] == attack}
            if cells:
                lines.append(f"{attack:<18}" + "".join(f"{cells.get(x, '-'):>14}" for x in reds))
    return "\n".join(lines)


def _goal_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for strategy in STRATEGIES:
        per: dict[str, Any] = {}
        for attack in GOAL_ATTACKS:
            get = {
                r["reducer"]: r["ratio"] for r in rows if r["strategy"] == strategy and r["attack"] == attack
            }
            if "centered_clip" not in get:
                continue
            cc, mean = get["centered_clip"], get.get("mean")
            per[attack] = {
                "centered_clip_ratio": cc,
                "mean_ratio": mean,
                "centered_clip_within_5pct": cc is not None and cc <= 1 + GOAL_TOLERANCE,
                "mean_fails": mean is not None and mean > MEAN_FAILS,
            }
        if per:
            out[strategy] = per
    return out


README_LABELS = {
    "sign_flip": "sign flip (x4)",
    "random_direction": "random direction",
    "gaussian_noise": "Gaussian noise",
    "label_flip": "label flip",
    "alie": "ALIE",
    "ipm": "IPM (eps=2)",
    "stale": "stale",
    "malicious_owner": "malicious owner",
}
README_COLUMNS = [
    ("diloco", "mean", "mean (DiLoCo)"),
    ("diloco", "centered_clip", "centered_clip (DiLoCo)"),
    ("data_parallel", "mean", "mean (DataParallel)"),
    ("data_parallel", "centered_clip", "centered_clip (DataParallel)"),
]


def readme_table(saved: dict[str, Any], n: int = 16) -> str:
    """The README's markdown table: final loss / clean loss at ``n`` peers in the main grid, mean vs
    centered_clip for both strategies, plus a line with the clean losses (the denominators)."""
    rows = [r for r in saved["grid"] if r["n"] == n]
    if not rows:
        return f"(no main-grid rows with n={n} in this JSON: not re-measured)"
    f = max(r["f"] for r in rows)
    head = "| attack | " + " | ".join(c[2] for c in README_COLUMNS) + " |"
    lines = [head, "|---" * (len(README_COLUMNS) + 1) + "|"]
    for attack, label in README_LABELS.items():
        cells = []
        for strategy, reducer, _ in README_COLUMNS:
            key = (strategy, reducer, attack)
            hit = [r for r in rows if (r["strategy"], r["reducer"], r["attack"]) == key]
            cells.append(_fmt(hit[0].get("ratio"), hit[0].get("status", "")) if hit else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    clean = {r["strategy"]: r["loss"] for r in rows if r["attack"] == "none" and r["reducer"] == "mean"}
    lines.append("")
    nan = float("nan")
    lines.append(
        f"{f} of {n} attackers; clean loss (mean, no attackers): DiLoCo {clean.get('diloco', nan):.3f}, "
        f"DataParallel {clean.get('data_parallel', nan):.3f} nats/byte."
    )
    return "\n".join(lines)


def _plot(grid: list[dict[str, Any]], goal: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    import numpy as np

    strategies = list(STRATEGIES)
    sizes = sorted({r["n"] for r in grid})
    fig, axes = plt.subplots(2, 3, figsize=(21, 11))
    for row_i, strategy in enumerate(strategies):
        for col_i in range(2):
            ax = axes[row_i, col_i]
            if col_i >= len(sizes):
                ax.axis("off")
                continue
            n = sizes[col_i]
            sel = [r for r in grid if r["strategy"] == strategy and r["n"] == n]
            attacks = ["none", *ATTACKS]
            mat = np.full((len(attacks), len(REDUCERS)), np.nan)
            for r in sel:
                i, j = attacks.index(r["attack"]), REDUCERS.index(r["reducer"])
                if r["ratio"] is not None:
                    mat[i, j] = min(r["ratio"], 10.0)
            im = ax.imshow(np.log2(mat), cmap="RdYlGn_r", vmin=-0.2, vmax=1.5, aspect="auto")
            for r in sel:
                i, j = attacks.index(r["attack"]), REDUCERS.index(r["reducer"])
                ax.text(j, i, _fmt(r["ratio"], r["status"]), ha="center", va="center", fontsize=8)
            f = max(r["f"] for r in sel)
            tol = {r["reducer"]: r.get("tolerates", f) for r in sel if r["attack"] != "none"}
            labels = [x if tol.get(x, f) in (f, 0) else f"{x} (built for f={tol[x]})" for x in REDUCERS]
            ax.set_title(f"{strategy}, {f} of {n} attackers: final loss / clean loss")
            ax.set_xticks(range(len(REDUCERS)), labels, rotation=30, ha="right", fontsize=8)
            ax.set_yticks(range(len(attacks)), attacks, fontsize=8)
            fig.colorbar(im, ax=ax, label="log2(ratio)")
    for ax, strategy in zip([axes[0, 2], axes[1, 2]], STRATEGIES, strict=False):
        sel = [r for r in goal if r["strategy"] == strategy and r["attack"] != "none"]
        attacks = [a for a in GOAL_ATTACKS if any(r["attack"] == a for r in sel)]
        x = np.arange(len(attacks))
        for k, (red, color) in enumerate((("mean", "tab:red"), ("centered_clip", "tab:green"))):
            vals = [
                next(
                    (min(r["ratio"] or 1e3, 1e3) for r in sel if r["attack"] == a and r["reducer"] == red),
                    np.nan,
                )
                for a in attacks
            ]
            ax.bar(x + (k - 0.5) * 0.38, vals, 0.38, label=red, color=color)
        ax.axhline(1 + GOAL_TOLERANCE, color="k", ls="--", lw=1, label="clean + 5%")
        ax.set_yscale("log")
        ax.set_xticks(x, attacks, rotation=20)
        batch, gn, gf = (sel[0]["batch"], sel[0]["n"], sel[0]["f"]) if sel else ("?", "?", "?")
        ax.set_title(f"goal: {strategy}, {gf} of {gn} attackers, batch {batch}")
        ax.set_ylabel("final loss / clean loss")
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small smoke grid (n=8 only, few rounds)")
    ap.add_argument(
        "--sizes",
        default="8,16",
        help="comma-separated n of the main grid (8: 3 attackers, 16: 7 attackers); the goal grid is 16",
    )
    ap.add_argument(
        "--readme-table", metavar="JSON", help="only print the README's table (7 of 16) from a results JSON"
    )
    ap.add_argument("--batch", type=int, default=128, help="per-peer batch of the main grid")
    ap.add_argument("--goal-batch", type=int, default=512, help="per-peer batch of the goal grid")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--replot", metavar="JSON", help="only redraw the PNG from a results JSON")
    ap.add_argument("--real-peers", action="store_true", help="only the real-peer rows (swarmtrain simulate)")
    ap.add_argument("--real-steps", type=int, default=40, help="local steps per real peer")
    ap.add_argument(
        "--real-groups",
        default="one,one-new,two",
        help="comma-separated real-peer groups: one (3 peers: sign flip, random direction, noise, stale), "
        "one-new (3 peers: label flip, malicious owner), two (5 peers, 2 colluders: ALIE, IPM)",
    )
    args = ap.parse_args(argv)
    if args.real_peers:
        from byzantine_real import real_peers

        return real_peers(Path(args.out), args.real_steps, [g for g in args.real_groups.split(",") if g])
    if args.readme_table:
        print(readme_table(json.loads(Path(args.readme_table).read_text())))
        return 0
    if args.replot:
        saved = json.loads(Path(args.replot).read_text())
        _plot(saved["grid"], saved["goal"], Path(args.replot).with_suffix(".png"))
        return 0
    torch.set_num_threads(args.threads)
    corpus = load_corpus()
    attackers_of = {8: 3, 16: 7}
    sizes = [int(x) for x in args.sizes.split(",") if x]
    if any(x not in attackers_of for x in sizes):
        ap.error(f"--sizes: each n must be one of {sorted(attackers_of)}")
    nf = [(8, 3)] if args.quick else [(x, attackers_of[x]) for x in sorted(sizes)]
    rounds_override = {"data_parallel": 20, "diloco": 3} if args.quick else {}
    t0 = time.perf_counter()
    grid: list[dict[str, Any]] = []
    for strategy in STRATEGIES:
        for n, f in nf:
            cells = [("none", "mean")] + [("none", r) for r in REDUCERS[1:]]
            cells += [(a, r) for a in ATTACKS for r in REDUCERS]
            for attack, reducer in cells:
                row = _run(strategy, n, f, attack, reducer, args.batch, corpus, rounds_override.get(strategy))
                grid.append(row)
                print(
                    f"  {strategy:<13} n={n:<2} {attack:<16} {reducer:<17} {row['status'][:40]:<12} "
                    f"loss={row['loss']} ({row['seconds']}s)",
                    flush=True,
                )
    goal: list[dict[str, Any]] = []
    gn, gf = (8, 3) if args.quick else (16, 7)
    for strategy in STRATEGIES:
        for attack in ["none", *GOAL_ATTACKS]:
            for reducer in ("mean", "centered_clip"):
                row = _run(
                    strategy, gn, gf, attack, reducer, args.goal_batch, corpus, rounds_override.get(strategy)
                )
                goal.append(row)
                print(
                    f"  goal {strategy:<13} {attack:<16} {reducer:<14} "
                    f"loss={row['loss']} ({row['seconds']}s)",
                    flush=True,
                )
    _with_ratios(grid)
    _with_ratios(goal)
    summary = _goal_summary(goal)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "byzantine_quick" if args.quick else "byzantine"
    meta = {
        "benchmark": "byzantine",
        "quick": args.quick,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "threads": args.threads,
        "seconds": round(time.perf_counter() - t0, 1),
        "strategies": STRATEGIES,
        "stale_delay": STALE_DELAY,
        "batch": args.batch,
        "goal_batch": args.goal_batch,
        "corpus_bytes": len(corpus),
        "model": "ByteMLP(context=8, embed=8, hidden=32)",
        "collective": "optimizers.InProcessGroup, one thread per peer (benchmarks/byzantine_sim.py)",
        "strategy_code": "optimizers.build_strategy (DataParallel, DiLoCo), inner torch.optim.Adam",
        "attacker_model": "omniscient: attacker rows forged on the stack the reducer sees (forge_rows)",
        "sizes": [n for n, _ in nf],
        "not_measured": [f"main grid n={x}" for x in sorted(attackers_of) if x not in {n for n, _ in nf}],
        "recorded": recorded(),
        "real_peer_rows": "byzantine_real.json (python benchmarks/byzantine.py --real-peers)",
        "goal_tolerance": GOAL_TOLERANCE,
        "mean_fails_above": MEAN_FAILS,
    }
    payload = {"meta": meta, "grid": grid, "goal": goal, "goal_summary": summary}
    table = [_table(grid, "== main grid =="), _table(goal, "\n== goal grid =="), *_goal_lines(summary)]
    write_report(
        out / f"{stem}.json",
        payload,
        table,
        plot=lambda d, png: _plot(d["grid"], d["goal"], png),
        indent=1,
        default=str,
    )
    print(f"in {meta['seconds']} s")
    return 0


def _goal_lines(summary: dict[str, Any]) -> list[str]:
    """Whether centered_clip kept within 5 % of the clean loss and the mean failed, by strategy, attack."""
    lines = ["\n== goal: centered_clip within 5% of clean, mean ratio > 1.2 =="]
    for strategy, per in summary.items():
        for attack, s in per.items():
            lines.append(
                f"{strategy:<14}{attack:<18} centered_clip x{s['centered_clip_ratio']:.3f} "
                f"({'OK' if s['centered_clip_within_5pct'] else 'MISSED'})   mean x{s['mean_ratio']:.3g} "
                f"({'fails' if s['mean_fails'] else 'does not fail'})"
            )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
