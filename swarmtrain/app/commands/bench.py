"""``swarmtrain bench ...``: measured comparisons that print a table and write JSON.

``swarmtrain bench codecs [--size N] [--json PATH]`` measures every codec's compress and decompress
throughput against a same-run tensor copy (``compression.benchmark``); the default size is the
smallest out of the last-level cache (``swarmtrain.app.bench.codecs``), seconds on 2 cores.
``swarmtrain bench strategies ...`` sweeps strategies and settings through the in-process harness
against fp32 DataParallel (``swarmtrain.app.bench.strategies``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from swarmtrain.app.bench.codecs import (
    DEFAULT_LLC_BYTES,
    cache_warning,
    default_size,
    in_cache,
    last_level_cache_bytes,
    mark_above,
)
from swarmtrain.app.commands.flags import command, config_overrides, flag
from swarmtrain.core.errors import ConfigError

if TYPE_CHECKING:  # imported for real inside the functions, so --help stays fast
    from rich.table import Table

    from compression.benchmark import CodecResult
    from swarmtrain.app.bench.strategies import Grid

__all__ = [
    "register",
    "bench_app",
    "codec_table",
    "last_level_cache_bytes",
    "cache_warning",
    "in_cache",
    "mark_above",
    "DEFAULT_LLC_BYTES",
    "StrategiesOptions",
]

bench_app = typer.Typer(
    name="bench",
    help="Measured comparisons: print a table, write JSON.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def codec_table(results: Sequence[CodecResult], size: int, device: str, mark: float = 1.0) -> Table:
    """The results as a rich table that reads at 80 columns: headers wrap at their spaces and no
    cell has one, so no number is cut. A roofline fraction above ``mark`` is marked ``!``."""
    from rich.table import Table

    from compression.benchmark import TABLE_HEADER, table_rows

    copy = results[0].copy_rw_gbps if results else 0.0
    roofline_cols = [i for i, col in enumerate(TABLE_HEADER) if "roofline" in col]
    rows = [
        [f"{c}!" if i in roofline_cols and float(c) > mark else c for i, c in enumerate(row)]
        for row in table_rows(results)
    ]
    table = Table(
        title=f"codecs on {size:,} float32 elements ({device}); copy {copy:.1f} GB/s r+w",
        box=None,  # no rules: two spaces between columns leave room for the widest cells at 80
        pad_edge=False,
        header_style="bold",
    )
    for i, col in enumerate(TABLE_HEADER):
        widest = max([len(word) for word in col.split()] + [len(row[i]) for row in rows])
        # fixed at its widest word or cell: rich's own shrinking would cut cells before headers wrap
        table.add_column(col, justify="left" if i == 0 else "right", width=widest, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


@bench_app.command("codecs")
def codecs(
    size: int | None = typer.Option(
        None,
        "--size",
        help="Elements of the float32 test tensor [the smallest power of two out of the last-level "
        "cache: twice its size in float32, 4M to 64M].",
    ),
    json_path: str | None = typer.Option(None, "--json", help="Write the results as JSON here."),
    codec: list[str] | None = typer.Option(None, "--codec", help="Codec to measure (repeatable)."),
    reps: int = typer.Option(3, "--reps", help="Timed repetitions per codec (best is kept)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    block: int = typer.Option(256, "--block", help="Block size of int8/int4/ternary."),
    from_run: Path | None = typer.Option(
        None,
        "--from-run",
        help="Measure error and bits/element on the DiLoCo pseudo-gradients saved in this folder "
        "(round-*.safetensors), without and with error feedback, instead of throughput.",
    ),
    capture: bool = typer.Option(
        False,
        "--capture",
        help="With --from-run: first train a short DiLoCo run (2 in-process workers, 8 rounds of "
        "H=10, tiny) and save its pseudo-gradients there.",
    ),
) -> None:
    """Compress/decompress throughput of every codec, as GB/s and as a fraction of the copy roofline."""
    from rich.console import Console

    from compression.benchmark import DEFAULT_CODECS, benchmark_codecs, report

    _check_codec_flags(size, reps, device, capture, from_run)
    if from_run is not None:
        _codecs_from_run(from_run, list(codec or DEFAULT_CODECS), json_path, capture)
        return
    console = Console(stderr=True)
    llc = last_level_cache_bytes(device)
    size = size or default_size(llc)
    results = benchmark_codecs(
        size,
        tuple(codec) if codec else DEFAULT_CODECS,
        reps=reps,
        device=device,
        block=block,
        progress=lambda msg: console.log(msg),
    )
    mark = mark_above(size, llc)
    Console().print(codec_table(results, size, device, mark))
    best = {r.codec: max(r.compress_roofline, r.decompress_roofline) for r in results}
    warning = cache_warning(size, llc, {k: v for k, v in best.items() if v > mark})
    if warning:
        typer.echo(warning, err=True)
    if json_path:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report(results, device), indent=2) + "\n", encoding="utf-8")
        console.log(f"wrote {path}")


def _check_codec_flags(
    size: int | None, reps: int, device: str, capture: bool, from_run: Path | None
) -> None:
    """One line for a bad ``bench codecs`` flag."""
    import torch

    if capture and from_run is None:
        raise ConfigError("--capture needs --from-run DIR (where the pseudo-gradients go)")
    if size is not None and size < 1024:
        raise ConfigError(f"--size must be at least 1024 elements, got {size}")
    if reps < 1:
        raise ConfigError(f"--reps must be at least 1, got {reps}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available")


#: the run ``bench codecs --capture`` trains: 8 outer rounds of fp32 DiLoCo (its pseudo-gradients raw)
CAPTURE_RUN: dict[str, Any] = {
    "strategy.name": "diloco",
    "compression.codec": "none",
    "strategy.inner_steps": 10,
    "train.steps": 80,
    "train.batch_size": 8,
    "train.eval_interval": 10_000_000,
}


def _codecs_from_run(run_dir: Path, codecs: list[str], json_path: str | None, capture: bool) -> None:
    """``bench codecs --from-run DIR [--capture]``: codec error on captured pseudo-gradients."""
    from rich.console import Console

    from swarmtrain.app.bench.pseudo import capture as capture_run
    from swarmtrain.app.bench.pseudo import load_rounds, measure_all, table_lines
    from swarmtrain.app.bench.strategies import load_point
    from swarmtrain.core.jsonsafe import dumps

    console = Console(stderr=True)
    if capture:
        console.print(f"capturing DiLoCo pseudo-gradients into {run_dir} (2 workers, 80 steps, H=10)")
        capture_run(load_point(None, CAPTURE_RUN), 2, run_dir)
    rounds = load_rounds(run_dir)
    rows = measure_all(rounds, codecs)
    numel = sum(t.numel() for t in rounds[0].values())
    for line in table_lines(rows, len(rounds), numel):
        typer.echo(line)
    if json_path:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"run_dir": str(run_dir), "rounds": len(rounds), "numel": numel, "rows": rows}
        path.write_text(dumps(doc, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {path}")


def _floats(text: str, flag: str) -> list[float | None]:
    try:
        return [float(x) for x in text.split(",") if x.strip()] or [None]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated numbers, got {text!r}") from None


def _ints(text: str, flag: str) -> list[int | None]:
    try:
        return [int(x) for x in text.split(",") if x.strip()] or [None]
    except ValueError:
        raise ConfigError(f"{flag}: expected comma-separated integers, got {text!r}") from None


def _words(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _grid_from_flags(opts: StrategiesOptions) -> Grid:
    """The comma-separated flags as a ``Grid`` (an empty flag: the config's value)."""
    from swarmtrain.app.bench.strategies import Grid, parse_sweep

    return Grid(
        strategies=_words(opts.strategy),
        codecs=_words(opts.codec) or ["int8"],
        inner_steps=_ints(opts.inner_steps or (str(QUICK_H) if opts.quick else ""), "--inner-steps"),
        outer_lrs=_floats(opts.outer_lr, "--outer-lr"),
        outer_momenta=_floats(opts.outer_momentum, "--outer-momentum"),
        error_feedback=[*_words(opts.error_feedback)] or [None],
        sweeps=[parse_sweep(s) for s in opts.sweep or ()],
        controls=opts.controls,
    )


def _grid_progress(
    console: Any, n_points: int, total: int, save: Callable[[list[dict[str, Any]]], object]
) -> Callable[[dict[str, Any], list[dict[str, Any]]], None]:
    """A line per finished run (in-process points first, then real-peer re-runs), and the outputs
    rewritten after each, so an interrupted grid keeps what it measured."""
    done = [0]

    def on_row(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        done[0] += 1
        real = "real_wall_s" in row and done[0] > n_points
        wall = row["real_wall_s"] if real else row["wall_s"]
        loss = row["real_final_val_loss"] if real else row["final_val_loss"]
        where = "real peers" if real else "in-process"
        console.print(f"[{done[0]}/{total}] {row['label']} ({where}): val loss {loss:.4f} in {wall:.0f} s")
        save(rows)

    return on_row


#: validation batches of a benchmark's evaluation (8 batches moved a gap by 0.3 points against 32)
BENCH_EVAL_BATCHES = 32
#: ``bench strategies --quick``: a grid that finishes in minutes on 2 cores (not a measurement)
QUICK: dict[str, Any] = {"train.steps": 24, "train.batch_size": 8, "train.eval_batches": 8}
QUICK_H = 4
#: curve points recorded per run (every sync when syncs are at least steps/16 apart: H >= 19 at 300
#: steps; DataParallel and shorter H every ceil(steps/16) steps), besides the end
CURVE_POINTS = 16


@dataclass(frozen=True)
class StrategiesOptions:
    """What ``swarmtrain bench strategies`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``). The comma-separated lists are the grid's axes (empty: the
    config's), the command's own; ``--steps``, ``--batch-size`` and ``--preset`` set every point's
    config (``None``: the config's)."""

    strategy: str = flag("diloco", "--strategy", help="Comma-separated: diloco, streaming_diloco, demo.")
    codec: str = flag("int8", "--codec", help="Comma-separated pseudo-gradient codecs.")
    inner_steps: str = flag("", "--inner-steps", "-H", help="Comma-separated H values [30; --quick: 4].")
    outer_lr: str = flag("", "--outer-lr", help="Comma-separated outer learning rates [config's].")
    outer_momentum: str = flag("", "--outer-momentum", help="Comma-separated outer momenta [config's].")
    error_feedback: str = flag("", "--error-feedback", help="Comma-separated: none, ef [config's].")
    sweep: list[str] | None = flag(
        None,
        "--sweep",
        help="Sweep any config field too: [STRATEGY:]SECTION.FIELD=V1,V2,... (repeatable), e.g. "
        "demo:train.lr=3e-4,1e-3 or strategy.mixing=0.3,0.5 (strategy.* fields only where the "
        "strategy has them).",
    )
    workers: int | None = flag(None, "--workers", min=1, help="In-process workers per point [4; --quick: 2].")
    steps: int | None = flag(
        None, "--steps", key="train.steps", min=1, help="Local steps per worker [300; --quick: 24]."
    )
    batch_size: int | None = flag(
        None,
        "--batch-size",
        key="train.batch_size",
        min=1,
        help="Sequences per worker and step [16; --quick: 8].",
    )
    preset: str | None = flag(None, "--preset", key="model.preset", help="Model preset [tiny].")
    eval_batches: int | None = flag(
        None,
        "--eval-batches",
        key="train.eval_batches",
        min=1,
        help=f"Validation batches per evaluation [{BENCH_EVAL_BATCHES}; "
        f"--quick: {QUICK['train.eval_batches']}].",
    )
    seeds: int = flag(
        1,
        "--seeds",
        min=1,
        help="Seeds per point (data order and codec draws, each worker its own): mean and 95 % "
        "t-interval per point.",
    )
    controls: bool = flag(
        True,
        "--controls/--no-controls",
        help="A fp32 control point (same strategy, H, outer step, seeds) for every codec point.",
    )
    quick: bool = flag(
        False,
        "--quick",
        help="A fast smoke grid (2 workers, 24 steps of batch 8, H=4, 8 eval batches); said so in the JSON.",
    )
    config: Path | None = flag(None, "--config", help="A TOML config below the flags.")
    real_peers: int = flag(
        0,
        "--real-peers",
        min=0,
        help="Re-run the K best points and the reference with real peer processes.",
    )
    json_path: Path = flag(Path("bench-strategies.json"), "--json", help="JSON; CSV and PNGs beside it.")
    link: str | None = flag(
        None,
        "--link",
        help="Also plot loss against a modelled (not measured) wall-clock over a link, e.g. "
        "100mbit,50ms: measured compute per step + RTT per sync + bytes / bandwidth.",
    )

    def n_workers(self) -> int:
        return self.workers or (2 if self.quick else 4)

    def base_overrides(self) -> dict[str, Any]:
        """What every point of the grid shares, as config overrides: the given flags; else 300 steps
        and 32 evaluation batches (a benchmark's), or ``--quick``'s smaller run; the rest the config's."""
        given = {k: v for k, v in config_overrides(self).items() if v is not None}
        quick = QUICK if self.quick else {"train.steps": 300, "train.eval_batches": BENCH_EVAL_BATCHES}
        return {**quick, **given, "train.eval_interval": 10_000_000}  # evaluated at the end (and the curve)


@bench_app.command("strategies")
@command(StrategiesOptions)
def strategies(opts: StrategiesOptions) -> None:
    """Sweep strategies and settings in one process (the in-process harness) against fp32 DataParallel.

    Every point trains the same run as `swarmtrain simulate` (model, data, seed, steps, per-worker
    batch) with N workers in this process; the table gives each point's validation-loss gap to
    DataParallel and how many fewer bytes per token it sends, and marks the Pareto front. With
    --seeds K each point runs K times (seed k: data order train.seed + k, codec draws from it, each
    worker its own) and
    reports the mean and a 95 % t-interval; every codec point gets a fp32 control, so its gap splits
    into the strategy's part and the codec's. Each run records (step, tokens, bytes, val loss) at
    its syncs: the curves, plotted against bytes beside the JSON.
    """
    from rich.console import Console

    from swarmtrain.app.bench.link import parse_link
    from swarmtrain.app.bench.strategies import grid_points, load_point, run_grid, settings, write_outputs

    link = parse_link(opts.link) if opts.link else None  # a bad --link is one line before training
    grid = _grid_from_flags(opts)
    base = opts.base_overrides()
    config, workers, real_peers, json_path = opts.config, opts.n_workers(), opts.real_peers, opts.json_path
    points = grid_points(grid)
    for p in points:  # every point's config is valid before the first one trains
        load_point(config, {**base, **p.overrides})
    meta = {
        **settings(base, workers, config),
        "seeds": opts.seeds,
        "quick": opts.quick,
        "curve": "validation loss after each committed sync (at most "
        f"{CURVE_POINTS} a run, worker 0's synced model) and at the end",
        **({"link": link.as_json()} if link else {}),
    }
    if meta["eval_batches"] < BENCH_EVAL_BATCHES:
        few = meta["eval_batches"]
        meta["eval_note"] = f"{few} eval batches: fewer than a benchmark's {BENCH_EVAL_BATCHES} (quick)"
    console = Console(stderr=True)
    total = len(points) + (min(real_peers, len(points) - 1) + 1 if real_peers else 0)
    on_row = _grid_progress(console, len(points), total, lambda rows: write_outputs(rows, meta, json_path))
    console.print(
        f"bench strategies: {len(points)} points x {opts.seeds} seeds x {workers} workers x "
        f"{meta['steps']} steps (batch {meta['batch_size']}, {meta['preset']})"
    )
    from swarmtrain.simulation.runner import run_simulation

    rows = run_grid(
        base,
        points,
        workers,
        config_path=config,
        real_peers=real_peers,
        real_run=run_simulation,
        on_row=on_row,
        seeds=opts.seeds,
        curve_points=CURVE_POINTS,
    )
    _report(rows, meta, json_path, console)


def _report(rows: list[dict[str, Any]], meta: dict[str, Any], json_path: Path, console: Any) -> None:
    """The grid's table on stdout; its JSON, CSV and PNG written (each path on stderr)."""
    from swarmtrain.app.bench.strategies import table_lines, write_outputs

    for line in table_lines(rows):
        typer.echo(line)
    for path in write_outputs(rows, meta, json_path):
        console.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add the ``bench`` command group to the CLI."""
    app.add_typer(bench_app, name="bench")
