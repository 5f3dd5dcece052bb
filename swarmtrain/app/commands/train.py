"""``swarmtrain train``: a single-peer run of the local training loop (strategy ``local`` by default).

Flags override ``SWARMTRAIN_*`` environment variables, which override the ``--config`` file; with
``--resume DIR`` the checkpoint's saved config is the lowest layer, so a bare ``--resume`` continues
the same run. Heavy imports (torch) happen inside the command so ``--help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import typer

from swarmtrain.app.commands.flags import command, config_overrides, flag
from swarmtrain.core.errors import ConfigError

__all__ = ["register", "train", "TrainOptions"]


@dataclass(frozen=True)
class TrainOptions:
    """What ``swarmtrain train`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``; ``None``: not given, the lower layers' value)."""

    config: str | None = flag(None, "--config", "-c", help="TOML config file.")
    preset: str | None = flag(
        None, "--preset", key="model.preset", help="Model size: tiny, small or gpt2-124m."
    )
    steps: int | None = flag(
        None, "--steps", key="train.steps", help="Total optimizer steps (sets the LR schedule)."
    )
    max_time: float | None = flag(
        None, "--max-time", key="train.max_time", help="Stop after this many seconds."
    )
    batch_size: int | None = flag(
        None, "--batch-size", key="train.batch_size", help="Sequences per micro-batch."
    )
    grad_accum: int | None = flag(
        None, "--grad-accum", key="train.grad_accum", help="Micro-batches per step."
    )
    lr: float | None = flag(None, "--lr", key="train.lr", help="Peak learning rate.")
    optimizer: str | None = flag(
        None,
        "--optimizer",
        key="train.optimizer",
        help="Inner optimizer: adamw, adamw8bit (8-bit states; needs bitsandbytes) or sgd.",
    )
    device: str | None = flag(None, "--device", key="train.device", help="auto, cpu, cuda or cuda:N.")
    compile_: bool | None = flag(
        None, "--compile/--no-compile", key="train.compile", help="Use torch.compile."
    )
    # the config infers data.source from the paths (all .bin or token folders: bin, else text), over
    # any source a lower layer set for other paths
    data: list[str] | None = flag(
        None,
        "--data",
        key="data.paths",
        help="Text file/folder or .bin token file (repeatable); default: Python stdlib.",
    )
    out_dir: str | None = flag(
        None, "--out-dir", key="train.out_dir", help="Where metrics and checkpoints go."
    )
    seed: int | None = flag(None, "--seed", key="train.seed", help="Seed of the init and the data order.")
    threads: int | None = flag(
        None, "--threads", key="train.threads", help="CPU threads for torch (default: all cores)."
    )
    checkpoint_interval: int | None = flag(
        None,
        "--checkpoint-interval",
        key="train.checkpoint_interval",
        help="Save a checkpoint every N steps (always at the end).",
    )
    resume: str | None = flag(None, "--resume", help="Checkpoint folder to continue from.")
    progress: bool | None = flag(
        None, "--progress/--no-progress", key="train.progress", help="Show a progress bar."
    )


def register(app: typer.Typer) -> None:
    """Add the ``train`` command to ``app``."""
    app.command("train")(train)


@command(TrainOptions)
def train(opts: TrainOptions) -> None:
    """Train a byte-level GPT on this machine alone.

    With no options: the tiny preset on the Python standard library's sources, on CUDA when
    available. Prints the final train/val loss and where metrics and the checkpoint went.
    """
    from swarmtrain.core.config import load_config

    base = _resumed_config(opts.resume) if opts.resume is not None else None
    cfg = load_config(opts.config, config_overrides(opts), base=base)
    _run(cfg, opts.resume)


def _resumed_config(resume: str) -> dict[str, Any]:
    """The run config saved in the checkpoint ``resume`` (the lowest layer of a resumed run's).

    Raises:
        ConfigError: the checkpoint holds none.
    """
    from swarmtrain.app.train.checkpoint import read_meta

    saved = read_meta(resume).get("config")
    if not isinstance(saved, dict):
        raise ConfigError(f"--resume: {resume} holds no run config")
    return saved


def _run(cfg: Any, resume: str | None) -> None:
    from rich.console import Console

    from swarmtrain.app.data import describe_data
    from swarmtrain.app.train.trainer import StepInfo, Trainer

    out = Console(highlight=False, soft_wrap=True)
    trainer = Trainer(cfg)
    if resume is not None:
        trainer.load_checkpoint(resume)
    tc = cfg.train
    out.print(
        f"swarmtrain train: {cfg.model.preset} ({trainer.model.num_params() / 1e6:.2f}M params) on "
        f"{trainer.device}, {len(trainer.corpus.train):,} training tokens, "
        f"steps {trainer.step}->{tc.steps}" + (f", max {tc.max_time:g} s" if tc.max_time else "")
    )
    out.print(describe_data(cfg.data), markup=False)
    from swarmtrain.app.train.memory_budget import budget_report

    out.print(budget_report(cfg, trainer.device), markup=False)
    bar_shown = tc.progress and Console(stderr=True).is_terminal

    def on_step(info: StepInfo) -> None:
        if not bar_shown and (info.step % tc.log_interval == 0 or info.step == tc.steps):
            out.print(
                f"step {info.step}/{tc.steps}  loss {info.loss:.4f}  lr {info.lr:.2e}  "
                f"{info.tokens_per_s:,.0f} tok/s"
            )

    tokens_before = trainer.tokens
    try:
        result = trainer.fit(on_step)
        path = trainer.save_checkpoint(trainer.checkpoint_dir)
    except KeyboardInterrupt:
        path = trainer.save_checkpoint(trainer.checkpoint_dir)
        out.print(f"interrupted at step {trainer.step}; checkpoint saved to {path}")
        raise
    finally:
        trainer.close()
    tps = ((result.tokens - tokens_before) / result.train_s) if result.train_s > 0 else 0.0
    val = "n/a" if result.final_val_loss is None else f"{result.final_val_loss:.4f}"
    out.print(
        f"done: step {result.steps}/{tc.steps}, {result.tokens:,} tokens, {result.wall_s:.1f} s this run "
        f"({tps:,.0f} tok/s)"
    )
    out.print(f"final train loss {result.final_train_loss:.4f}, val loss {val}")
    out.print(f"metrics: {result.metrics_path}")
    out.print(f"checkpoint: {path}  (continue with: swarmtrain train --resume {path})")
