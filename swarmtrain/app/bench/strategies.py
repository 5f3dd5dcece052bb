"""``swarmtrain bench strategies``: a grid of strategies and settings through the in-process harness.

Every point trains the same run (model, data, seed, steps, per-worker batch, learning-rate schedule)
with ``workers`` in-process workers (``swarmtrain.app.bench.harness``); only the strategy, the codec, H,
the outer step and error feedback change. fp32 DataParallel runs first as the reference point: every
row reports its validation-loss gap to it and how many fewer bytes per token it sent. With
``Grid.controls`` every codec row of an outer strategy gets a fp32 control (same strategy, H, outer
step and seeds, codec ``none``), so its gap splits into the strategy's part (the control's gap) and
the codec's (the row's gap to its control). With several seeds (seed k: data order ``train.seed +
k``, and the codec's run seed the same, from which each worker derives its own draws'
``compression.peer_seed``; k = 0 is the config's own run) each row reports the mean and a 95 %
t-interval (``stats``), gaps paired by seed. Outputs (``outputs``): a table, JSON (rewritten after
every point, so an interrupted grid keeps what it measured), a CSV with the same rows, a Pareto plot
(final validation loss against bytes per token, with error bars) and the curves (validation loss
against cumulative bytes per worker). ``real_peers`` re-runs the best points (and the reference)
with real peer processes, so the two paths can be compared in the same output.
"""

from __future__ import annotations

import itertools
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmtrain.app.bench.outputs import markdown_table, table_lines, write_outputs
from swarmtrain.app.bench.stats import mean_ci95, paired_gaps
from swarmtrain.core.config import Config, load_config
from swarmtrain.core.errors import ConfigError

__all__ = [
    "GridPoint",
    "Sweep",
    "parse_sweep",
    "Grid",
    "grid_points",
    "pareto",
    "load_point",
    "seeded",
    "run_grid",
    "settings",
    "write_outputs",  # the three from ``outputs``, re-exported
    "table_lines",
    "markdown_table",
]

#: strategies with an outer step (H, outer learning rate and momentum apply)
OUTER = ("diloco", "streaming_diloco")
REFERENCE = "data_parallel fp32"


@dataclass(frozen=True)
class GridPoint:
    """One configuration of the grid: a label, its config overrides and the label of its fp32
    control (``None``: it has none)."""

    label: str
    strategy: str
    codec: str
    overrides: dict[str, Any] = field(default_factory=dict)
    control: str | None = None


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
    """What to sweep; a setting that does not apply to a strategy is not crossed with it.
    ``controls``: a fp32 control point (codec ``none``, no error feedback, the rest the same) before
    each codec point of an outer strategy."""

    strategies: Sequence[str] = ("diloco",)
    codecs: Sequence[str] = ("int8",)
    inner_steps: Sequence[int | None] = (None,)
    outer_lrs: Sequence[float | None] = (None,)
    outer_momenta: Sequence[float | None] = (None,)
    error_feedback: Sequence[str | None] = (None,)
    sweeps: Sequence[Sweep] = ()
    controls: bool = False


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
            overrides, words = _settings_of(strategy, codec, h, lr, mom, ef)
            for swept in _swept(grid.sweeps, strategy):
                label = " ".join([*words, *(f"{k.rpartition('.')[2]}={_word(v)}" for k, v in swept)])
                if label in seen:
                    continue
                control = None
                if grid.controls and outer and codec not in (None, "none"):
                    control = _control(label, codec or "", overrides, dict(swept), points, seen)
                seen.add(label)
                points.append(GridPoint(label, strategy, codec or "", {**overrides, **dict(swept)}, control))
    for sweep in grid.sweeps:
        if not any(sweep.applies_to(s) for s in grid.strategies if s != "data_parallel"):
            where = f"{sweep.strategy}:" if sweep.strategy else ""
            raise ConfigError(f"--sweep {where}{sweep.key}: applies to none of the swept strategies")
    return points


def _settings_of(
    strategy: str, codec: str | None, h: int | None, lr: float | None, mom: float | None, ef: str | None
) -> tuple[dict[str, Any], list[str]]:
    """One combination of the axes as config overrides and the words of its label."""
    overrides: dict[str, Any] = {"strategy.name": strategy}
    words = [strategy]
    if codec is not None:
        overrides["compression.codec"] = codec
        words.append(_codec_word(codec))
    if h is not None:
        overrides["strategy.inner_steps"] = h
        words.append(f"H={h}")
    if lr is not None or mom is not None:
        if lr is not None:
            overrides["strategy.outer_lr"] = lr
        if mom is not None:
            overrides["strategy.outer_momentum"] = mom
        words.append(f"outer={_fmt(lr) if lr is not None else '-'}/{_fmt(mom) if mom is not None else '-'}")
    if ef is not None:
        overrides["compression.error_feedback"] = ef
        words.append(f"ef={ef}")
    return overrides, words


def _codec_word(codec: str) -> str:
    """A codec as a label says it: ``none`` is fp32 (the control's name)."""
    return "fp32" if codec == "none" else codec


def _control(
    label: str,
    codec: str,
    overrides: dict[str, Any],
    swept: dict[str, Any],
    points: list[GridPoint],
    seen: set[str],
) -> str:
    """The fp32 control of the point ``label`` (added to ``points`` unless already there); its label."""
    words = label.split(" ")
    words[1] = "fp32"
    words = ["ef=none" if w.startswith("ef=") else w for w in words]
    name = " ".join(words)
    if name not in seen:
        seen.add(name)
        fp32 = {**overrides, **swept, "compression.codec": "none", "compression.error_feedback": "none"}
        points.append(GridPoint(name, overrides["strategy.name"], "none", fp32))
    return name


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


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _curve(runs: Sequence[Any]) -> list[dict[str, Any]]:
    """The seeds' curves as one: per recorded sync (the same steps in every seed), the mean bytes and
    the validation loss's mean and 95 % interval over seeds."""
    out = []
    for pts in zip(*(r.curve for r in runs), strict=False):
        losses = [p.val_loss for p in pts]
        mean, ci = mean_ci95(losses)
        out.append(
            {
                "step": pts[0].step,
                "tokens": pts[0].tokens,
                "bytes": _mean([p.bytes for p in pts]),
                "val_loss": mean,
                "val_loss_ci95": ci,
                "val_losses": losses,
            }
        )
    return out


def _row(point: GridPoint, cfg: Config, runs: Sequence[Any], data_seeds: Sequence[int]) -> dict[str, Any]:
    """One point's row from its runs (one per seed): means over seeds, the loss's 95 % interval."""
    losses = [r.final_val_loss for r in runs]
    mean, ci = mean_ci95(losses)
    return {
        "label": point.label,
        "strategy": point.strategy,
        "codec": cfg.compression.codec,
        "error_feedback": cfg.compression.error_feedback,
        "inner_steps": getattr(cfg.strategy, "inner_steps", None),
        "outer_lr": getattr(cfg.strategy, "outer_lr", None),
        "outer_momentum": getattr(cfg.strategy, "outer_momentum", None),
        "overrides": point.overrides,
        "control": point.control,
        "seeds": len(runs),
        "data_seeds": list(data_seeds),
        "final_val_loss": mean,
        "val_loss_mean": mean,
        "val_loss_ci95": ci,
        "val_losses": losses,
        "bytes_sent_per_peer": _mean([r.bytes_sent_per_peer for r in runs]),
        "bytes_per_token": _mean([r.bytes_per_token for r in runs]),
        "peak_sync_bytes": max(r.peak_sync_bytes for r in runs),
        "rounds_committed": _mean([r.rounds_committed for r in runs]),
        "rounds_failed": _mean([r.rounds_failed for r in runs]),
        "params_identical": all(r.params_identical for r in runs),
        "wall_s": _mean([r.wall_s for r in runs]),
        **(
            {"local_val_loss": _mean([r.local_val_loss for r in runs])}
            if runs[0].local_val_loss is not None
            else {}
        ),
        "curve": _curve(runs),
    }


def _losses(r: dict[str, Any]) -> list[float]:
    return list(r.get("val_losses") or [r["final_val_loss"]])


def _gap(r: dict[str, Any], ref: dict[str, Any]) -> tuple[float, float | None]:
    """``r``'s gap to ``ref``: mean and 95 % interval of the per-seed gaps when both have the same
    seeds; else the ratio of the means, without an interval."""
    mine, theirs = _losses(r), _losses(ref)
    if len(mine) == len(theirs) and r.get("data_seeds") == ref.get("data_seeds"):
        return mean_ci95(paired_gaps(mine, theirs))
    return r["final_val_loss"] / ref["final_val_loss"] - 1, None


def _compare(rows: list[dict[str, Any]]) -> None:
    """Fill in each row's gap (and its interval) and byte reduction against the reference, its gap to
    its fp32 control (the codec's part; the control's own gap is the strategy's), and the Pareto flags."""
    ref = rows[0]
    by_label = {r["label"]: r for r in rows}
    for r in rows:
        r["gap_vs_dp"], r["gap_vs_dp_ci95"] = _gap(r, ref)
        r["reduction_vs_dp"] = ref["bytes_per_token"] / r["bytes_per_token"] if r["bytes_per_token"] else None
        control = by_label.get(r.get("control") or "")
        if control is not None:
            r["gap_vs_control"], r["gap_vs_control_ci95"] = _gap(r, control)
    front = pareto(rows)
    for r in rows:
        r["pareto"] = r["label"] in front


def seeded(cfg: Config, k: int) -> Config:
    """``cfg`` with its codec's random draws seeded for seed ``k``: the run's codec seed becomes
    ``train.seed + k``, seed k's data seed, from which each worker's own codec seed is derived
    (``compression.peer_seed``); codecs without a seed, and k = 0: ``cfg``."""
    from compression import build_compressor

    if k == 0:
        return cfg
    options = {**cfg.compression.options, "seed": cfg.train.seed + k}
    comp = cfg.compression.model_copy(update={"options": options})
    try:
        build_compressor(comp)
    except ConfigError:  # the codec takes no seed: deterministic
        return cfg
    return cfg.model_copy(update={"compression": comp})


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


def _run_seeds(
    cfg: Config, workers: int, seeds: int | None, curve_points: int
) -> tuple[list[Any], list[int]]:
    """One harness run per seed (``None``: the config's run, as before seeds); the runs and data seeds."""
    from swarmtrain.app.bench.harness import run_in_process

    if seeds is None:
        return [run_in_process(cfg, workers, curve_points=curve_points)], [cfg.train.seed]
    data_seeds = [cfg.train.seed + k for k in range(seeds)]
    runs = [
        run_in_process(seeded(cfg, k), workers, data_seed=d, curve_points=curve_points)
        for k, d in enumerate(data_seeds)
    ]
    return runs, data_seeds


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
    seeds: int | None = None,
    curve_points: int = 0,
) -> list[dict[str, Any]]:
    """Run ``points`` in order with the harness, ``seeds`` times each (``None``: once, the config's
    run), recording ``curve_points`` points of each run's curve; then re-run the ``real_peers`` best
    (lowest loss) non-reference points and the reference with ``real_run(cfg, workers)`` (real peer
    processes: ``swarmtrain.simulation.runner.run_simulation``, which only the CLI may import), which
    is compared with the harness's first seed (the config's own run). ``on_row(row, rows)`` after
    each point."""
    rows: list[dict[str, Any]] = []
    configs: dict[str, Config] = {}
    for point in points:
        cfg = load_point(config_path, {**base, **point.overrides}, env)
        configs[point.label] = cfg
        runs, data_seeds = _run_seeds(cfg, workers, seeds, curve_points)
        rows.append(_row(point, cfg, runs, data_seeds))
        _compare(rows)
        if on_row is not None:
            on_row(rows[-1], rows)
    if real_peers > 0:
        if real_run is None:
            raise ConfigError("real_peers needs real_run (a function that trains a config with real peers)")
        _real(rows, configs, workers, real_peers, real_run, on_row)
    return rows


def _real(
    rows: list[dict[str, Any]],
    configs: dict[str, Config],
    workers: int,
    k: int,
    real_run: Callable[[Config, int], Any],
    on_row: Callable[[dict[str, Any], list[dict[str, Any]]], None] | None,
) -> None:
    """Re-run the reference and the ``k`` best points with real peers, beside their harness rows."""
    best = sorted(rows[1:], key=lambda r: r["final_val_loss"])[:k]
    ref_real: dict[str, Any] = {}
    for r in [rows[0], *best]:
        res = real_run(configs[r["label"]], workers)
        r["real_final_val_loss"] = res.final_val_loss
        r["real_bytes_per_token"] = res.bytes_per_token
        r["real_params_identical"] = res.params_identical
        r["real_wall_s"] = res.wall_s
        r["real_vs_harness"] = res.final_val_loss / _losses(r)[0] - 1
        if r is rows[0]:
            ref_real = r
        else:
            r["real_gap_vs_dp"] = res.final_val_loss / ref_real["real_final_val_loss"] - 1
        if on_row is not None:
            on_row(r, rows)


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
        "eval_batches": cfg.train.eval_batches,
        "machine": f"{platform.machine()}, {platform.system()}",
        "bytes": "codec payload bytes one worker sent (real peers' ledger adds framing)",
    }
