"""``swarmtrain bench strategies``: a grid of strategies and settings through the in-process harness.

Every point trains the same run (model, data, seed, steps, per-worker batch, learning-rate schedule)
with ``workers`` in-process workers (``swarmtrain.app.bench.harness``); only the strategy, the codec, H,
the outer step and error feedback change. fp32 DataParallel runs first as the reference point: every
row reports its validation-loss gap to it and how many fewer bytes per token it sent. Outputs: a
table, JSON (rewritten after every point, so an interrupted grid keeps what it measured), a CSV with
the same rows, and a Pareto plot (final validation loss against bytes per token). ``real_peers``
re-runs the best points (and the reference) with real peer processes, so the two paths can be
compared in the same output.
"""

from __future__ import annotations

import csv
import itertools
import json
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmtrain.core.config import Config, load_config
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.jsonsafe import finite

__all__ = [
    "GridPoint",
    "Sweep",
    "parse_sweep",
    "Grid",
    "grid_points",
    "pareto",
    "load_point",
    "run_grid",
    "settings",
    "write_outputs",
    "table_lines",
    "markdown_table",
]

#: strategies with an outer step (H, outer learning rate and momentum apply)
OUTER = ("diloco", "streaming_diloco")
REFERENCE = "data_parallel fp32"


@dataclass(frozen=True)
class GridPoint:
    """One configuration of the grid: a label and its config overrides."""

    label: str
    strategy: str
    codec: str
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sweep:
    """Any config field swept over ``values`` (``--sweep [STRATEGY:]KEY=V1,V2``): only for the
    points of ``strategy`` (every strategy when ``None``); a ``strategy.*`` key only for the
    strategies whose config has that field. The reference point is never swept."""

    key: str
    values: Sequence[Any]
    strategy: str | None = None

    def applies_to(self, strategy: str) -> bool:
        from swarmtrain.core.config import STRATEGY_CONFIGS

        if self.strategy is not None and self.strategy != strategy:
            return False
        section, _, name = self.key.partition(".")
        return section != "strategy" or name in STRATEGY_CONFIGS[strategy].model_fields


def _value(text: str) -> Any:
    """A swept value as TOML would read it: an int, a float, true/false, else the word."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_sweep(text: str) -> Sweep:
    """``[STRATEGY:]SECTION.FIELD=V1,V2,...`` -> a :class:`Sweep`; a malformed one is one line."""
    head, eq, values = text.partition("=")
    strategy, colon, key = head.rpartition(":")
    words = [v.strip() for v in values.split(",") if v.strip()]
    if not eq or "." not in key or not words:
        raise ConfigError(
            f"--sweep {text!r}: expected [STRATEGY:]SECTION.FIELD=V1,V2,... "
            "(e.g. demo:train.lr=3e-4,1e-3 or strategy.mixing=0.3,0.5)"
        )
    return Sweep(key.strip(), [_value(w) for w in words], strategy.strip() if colon else None)


@dataclass(frozen=True)
class Grid:
    """What to sweep; a setting that does not apply to a strategy is not crossed with it."""

    strategies: Sequence[str] = ("diloco",)
    codecs: Sequence[str] = ("int8",)
    inner_steps: Sequence[int | None] = (None,)
    outer_lrs: Sequence[float | None] = (None,)
    outer_momenta: Sequence[float | None] = (None,)
    error_feedback: Sequence[str | None] = (None,)
    sweeps: Sequence[Sweep] = ()


def _fmt(x: float) -> str:
    return f"{x:g}"


def grid_points(grid: Grid) -> list[GridPoint]:
    """The reference (fp32 DataParallel) first, then every distinct point of the grid.

    DeMo sends its own sparse payload: codec, H and the outer step do not apply to it, so it is one
    point per error-feedback setting at most (and it ignores that too: one point). ``None`` in a
    list means "the config's value" and adds nothing to the label.
    """
    reference = {
        "strategy.name": "data_parallel",
        "compression.codec": "none",
        "compression.error_feedback": "none",
    }
    points = [GridPoint(REFERENCE, "data_parallel", "none", reference)]
    seen = {points[0].label}
    for strategy in grid.strategies:
        if strategy == "data_parallel":
            continue  # the reference; other codecs of DataParallel are a codec grid, not this one
        if strategy not in (*OUTER, "demo"):
            raise ConfigError(
                f"bench strategies: unknown strategy {strategy!r} (diloco, streaming_diloco, demo)"
            )
        outer = strategy in OUTER
        combos = itertools.product(
            grid.codecs if outer else (None,),
            grid.inner_steps if outer else (None,),
            grid.outer_lrs if outer else (None,),
            grid.outer_momenta if outer else (None,),
            grid.error_feedback if outer else (None,),
        )
        for codec, h, lr, mom, ef in combos:
            overrides: dict[str, Any] = {"strategy.name": strategy}
            words = [strategy]
            if codec is not None:
                overrides["compression.codec"] = codec
                words.append(codec)
            if h is not None:
                overrides["strategy.inner_steps"] = h
                words.append(f"H={h}")
            if lr is not None or mom is not None:
                if lr is not None:
                    overrides["strategy.outer_lr"] = lr
                if mom is not None:
                    overrides["strategy.outer_momentum"] = mom
                words.append(
                    f"outer={_fmt(lr) if lr is not None else '-'}/{_fmt(mom) if mom is not None else '-'}"
                )
            if ef is not None:
                overrides["compression.error_feedback"] = ef
                words.append(f"ef={ef}")
            for swept in _swept(grid.sweeps, strategy):
                label = " ".join([*words, *(f"{k.rpartition('.')[2]}={_word(v)}" for k, v in swept)])
                if label not in seen:
                    seen.add(label)
                    points.append(GridPoint(label, strategy, codec or "", {**overrides, **dict(swept)}))
    for sweep in grid.sweeps:
        if not any(sweep.applies_to(s) for s in grid.strategies if s != "data_parallel"):
            where = f"{sweep.strategy}:" if sweep.strategy else ""
            raise ConfigError(f"--sweep {where}{sweep.key}: applies to none of the swept strategies")
    return points


def _word(v: Any) -> str:
    return _fmt(v) if isinstance(v, float) else str(v).lower() if isinstance(v, bool) else str(v)


def _swept(sweeps: Sequence[Sweep], strategy: str) -> list[tuple[tuple[str, Any], ...]]:
    """Every combination of the sweeps that apply to ``strategy`` (one empty one when none do)."""
    axes = [[(s.key, v) for v in s.values] for s in sweeps if s.applies_to(strategy)]
    return list(itertools.product(*axes))


def pareto(rows: Sequence[dict[str, Any]]) -> set[str]:
    """Labels of the rows no other row beats on both validation loss and bytes per token."""
    front = set()
    for r in rows:
        dominated = any(
            o is not r
            and o["final_val_loss"] <= r["final_val_loss"]
            and o["bytes_per_token"] <= r["bytes_per_token"]
            and (o["final_val_loss"] < r["final_val_loss"] or o["bytes_per_token"] < r["bytes_per_token"])
            for o in rows
        )
        if not dominated:
            front.add(r["label"])
    return front


def _row(point: GridPoint, cfg: Config, res: Any) -> dict[str, Any]:
    return {
        "label": point.label,
        "strategy": point.strategy,
        "codec": cfg.compression.codec,
        "error_feedback": cfg.compression.error_feedback,
        "inner_steps": getattr(cfg.strategy, "inner_steps", None),
        "outer_lr": getattr(cfg.strategy, "outer_lr", None),
        "outer_momentum": getattr(cfg.strategy, "outer_momentum", None),
        "overrides": point.overrides,
        "final_val_loss": res.final_val_loss,
        "bytes_sent_per_peer": res.bytes_sent_per_peer,
        "bytes_per_token": res.bytes_per_token,
        "peak_sync_bytes": res.peak_sync_bytes,
        "rounds_committed": res.rounds_committed,
        "rounds_failed": res.rounds_failed,
        "params_identical": res.params_identical,
        "wall_s": res.wall_s,
    }


def _compare(rows: list[dict[str, Any]]) -> None:
    """Fill in each row's gap and byte reduction against the reference, and the Pareto flags."""
    ref = rows[0]
    for r in rows:
        r["gap_vs_dp"] = r["final_val_loss"] / ref["final_val_loss"] - 1
        r["reduction_vs_dp"] = ref["bytes_per_token"] / r["bytes_per_token"] if r["bytes_per_token"] else None
    front = pareto(rows)
    for r in rows:
        r["pareto"] = r["label"] in front


def load_point(
    config_path: Path | None, overrides: dict[str, Any], env: Mapping[str, str] | None = None
) -> Config:
    """A point's config: ``simulate``'s defaults (the README's run) < the file < env < ``overrides``."""
    import optimizers
    from compression import build_compressor
    from swarmtrain.app.local_run import SIMULATE_DEFAULTS

    cfg = load_config(config_path, overrides, env=env, base=SIMULATE_DEFAULTS)
    optimizers.STRATEGIES.get(cfg.strategy.name)  # a typo is one line before anything trains
    build_compressor(cfg.compression)
    return cfg


def run_grid(
    base: dict[str, Any],
    points: Sequence[GridPoint],
    workers: int,
    *,
    config_path: Path | None = None,
    env: Mapping[str, str] | None = None,
    real_peers: int = 0,
    real_run: Callable[[Config, int], Any] | None = None,
    on_row: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run ``points`` in order with the harness; then re-run the ``real_peers`` best (lowest loss)
    non-reference points and the reference with ``real_run(cfg, workers)`` (real peer processes:
    ``swarmtrain.simulation.runner.run_simulation``, which only the CLI may import).
    ``on_row(row, rows)`` after each run."""
    from swarmtrain.app.bench.harness import run_in_process

    rows: list[dict[str, Any]] = []
    configs: dict[str, Config] = {}
    for point in points:
        cfg = load_point(config_path, {**base, **point.overrides}, env)
        configs[point.label] = cfg
        rows.append(_row(point, cfg, run_in_process(cfg, workers)))
        _compare(rows)
        if on_row is not None:
            on_row(rows[-1], rows)
    if real_peers > 0:
        if real_run is None:
            raise ConfigError("real_peers needs real_run (a function that trains a config with real peers)")
        best = sorted(rows[1:], key=lambda r: r["final_val_loss"])[:real_peers]
        ref_real: dict[str, Any] = {}
        for r in [rows[0], *best]:
            res = real_run(configs[r["label"]], workers)
            r["real_final_val_loss"] = res.final_val_loss
            r["real_bytes_per_token"] = res.bytes_per_token
            r["real_params_identical"] = res.params_identical
            r["real_wall_s"] = res.wall_s
            r["real_vs_harness"] = res.final_val_loss / r["final_val_loss"] - 1
            if r is rows[0]:
                ref_real = r
            else:
                r["real_gap_vs_dp"] = res.final_val_loss / ref_real["real_final_val_loss"] - 1
            if on_row is not None:
                on_row(r, rows)
    return rows


def settings(
    base: dict[str, Any], workers: int, config_path: Path | None, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The shared settings of a grid, as the JSON records them."""
    cfg = load_point(config_path, base, env)
    return {
        "workers": workers,
        "preset": cfg.model.preset,
        "steps": cfg.train.steps,
        "batch_size": cfg.train.batch_size,
        "block_size": cfg.model.block_size,
        "lr": cfg.train.lr,
        "seed": cfg.train.seed,
        "machine": f"{platform.machine()}, {platform.system()}",
        "bytes": "codec payload bytes one worker sent (real peers' ledger adds framing)",
    }


def write_outputs(rows: list[dict[str, Any]], meta: dict[str, Any], json_path: Path) -> list[Path]:
    """JSON (``json_path``), a CSV and a PNG beside it with the same stem. Returns what was written."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(
        json.dumps(finite({"settings": meta, "rows": rows}), indent=2) + "\n", encoding="utf-8"
    )
    csv_path = json_path.with_suffix(".csv")
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(finite(rows))
    png = json_path.with_suffix(".png")
    _plot(rows, meta, png)
    return [json_path, csv_path, png]


def _plot(rows: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    front = sorted((r for r in rows if r.get("pareto")), key=lambda r: r["bytes_per_token"])
    for r in rows:
        ref = r["label"] == REFERENCE
        ax.scatter(
            r["bytes_per_token"],
            r["final_val_loss"],
            marker="*" if ref else "o",
            s=160 if ref else 40,
            color="black" if ref else ("tab:red" if r.get("pareto") else "tab:blue"),
            zorder=3,
        )
        ax.annotate(
            r["label"],
            (r["bytes_per_token"], r["final_val_loss"]),
            fontsize=7,
            xytext=(4, 3),
            textcoords="offset points",
        )
    if len(front) > 1:
        ax.plot(
            [r["bytes_per_token"] for r in front],
            [r["final_val_loss"] for r in front],
            color="tab:red",
            lw=1,
            zorder=2,
            label="Pareto front",
        )
        ax.legend()
    ax.set_xscale("log")
    ax.set_xlabel("bytes sent per token per worker (log)")
    ax.set_ylabel("final validation loss")
    ax.set_title(
        f"{meta['workers']} workers x {meta['steps']} steps of batch {meta['batch_size']} ({meta['preset']})"
    )
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The rows as plain text that fits 80 columns (labels wrap onto their own line when long)."""
    head = f"{'':34} {'val loss':>8} {'gap':>7} {'B/token':>9} {'less':>6} {'same':>4}"
    lines = [head, "-" * len(head)]
    for r in rows:
        red = r.get("reduction_vs_dp")
        cells = (
            f"{r['final_val_loss']:>8.4f} {r['gap_vs_dp']:>+7.2%} {r['bytes_per_token']:>9.2f} "
            f"{(f'{red:.0f}x' if red else '-'):>6} {'yes' if r['params_identical'] else 'NO':>4}"
        )
        mark = "*" if r.get("pareto") else " "
        label = f"{mark}{r['label']}"
        if len(label) > 34:
            lines.append(label)
            label = ""
        lines.append(f"{label:34} {cells}")
        if "real_final_val_loss" in r:
            real_gap = r.get("real_gap_vs_dp")
            lines.append(
                f"{'  real peers':34} {r['real_final_val_loss']:>8.4f} "
                f"{(f'{real_gap:+.2%}' if real_gap is not None else ''):>7} {r['real_bytes_per_token']:>9.2f}"
                f" {'':>6} {'yes' if r['real_params_identical'] else 'NO':>4}"
            )
    lines.append("* on the Pareto front (no other point has both lower loss and fewer bytes)")
    return lines


def markdown_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The rows as the README's Markdown table (real-peer re-runs as rows of their own)."""
    out = [
        "| point | val loss | vs DataParallel | bytes / token / worker | fewer bytes | identical |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        red = r.get("reduction_vs_dp")
        same = "yes" if r["params_identical"] else "NO"
        out.append(
            f"| {r['label']} | {r['final_val_loss']:.4f} | {r['gap_vs_dp']:+.2%} | "
            f"{r['bytes_per_token']:,.2f} | {f'{red:,.0f}x' if red else '-'} | {same} |"
        )
        if "real_final_val_loss" in r:
            gap = r.get("real_gap_vs_dp", 0.0)  # the reference's own real run: 0 by definition
            same = "yes" if r["real_params_identical"] else "NO"
            ref_bytes = rows[0].get("real_bytes_per_token")
            red = ref_bytes / r["real_bytes_per_token"] if ref_bytes and r["real_bytes_per_token"] else None
            out.append(
                f"| {r['label']}, real peers | {r['real_final_val_loss']:.4f} | {gap:+.2%} | "
                f"{r['real_bytes_per_token']:,.2f} (ledger) | {f'{red:,.0f}x' if red else '-'} | {same} |"
            )
    return out
