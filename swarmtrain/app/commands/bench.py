"""``swarmtrain bench ...``: measured comparisons that print a table and write JSON.

``swarmtrain bench codecs [--size N] [--json PATH]`` measures every codec's compress and decompress
throughput against a same-run tensor copy (``compression.benchmark``). Other benchmarks can add
commands to ``bench_app``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

__all__ = ["register", "bench_app"]

bench_app = typer.Typer(
    name="bench",
    help="Measured comparisons: print a table, write JSON.",
    no_args_is_help=True,
    rich_markup_mode=None,
)


@bench_app.command("codecs")
def codecs(
    size: int = typer.Option(1 << 26, "--size", help="Elements of the float32 test tensor (default 64M)."),
    json_path: str | None = typer.Option(None, "--json", help="Write the results as JSON here."),
    codec: list[str] | None = typer.Option(None, "--codec", help="Codec to measure (repeatable)."),
    reps: int = typer.Option(3, "--reps", help="Timed repetitions per codec (best is kept)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    block: int = typer.Option(256, "--block", help="Block size of int8/int4/ternary."),
) -> None:
    """Compress/decompress throughput of every codec, as GB/s and as a fraction of the copy roofline."""
    import torch
    from rich.console import Console
    from rich.table import Table

    from compression.benchmark import DEFAULT_CODECS, TABLE_HEADER, benchmark_codecs, report, table_rows
    from swarmtrain.core.errors import ConfigError

    if size < 1024:
        raise ConfigError(f"--size must be at least 1024 elements, got {size}")
    if reps < 1:
        raise ConfigError(f"--reps must be at least 1, got {reps}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available")
    console = Console(stderr=True)
    results = benchmark_codecs(
        size,
        tuple(codec) if codec else DEFAULT_CODECS,
        reps=reps,
        device=device,
        block=block,
        progress=lambda msg: console.log(msg),
    )
    table = Table(
        title=f"codecs on {size:,} float32 elements ({device}); copy {results[0].copy_rw_gbps:.1f} GB/s r+w"
    )
    for col in TABLE_HEADER:
        table.add_column(col, justify="left" if col == "codec" else "right", no_wrap=True)
    for row in table_rows(results):
        table.add_row(*row)
    out = Console()
    Console(width=max(out.width, 132)).print(table)
    if json_path:
        path = Path(json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report(results, device), indent=2) + "\n", encoding="utf-8")
        console.log(f"wrote {path}")


def register(app: typer.Typer) -> None:
    """Add the ``bench`` command group to the CLI."""
    app.add_typer(bench_app, name="bench")
