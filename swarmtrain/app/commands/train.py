"""``swarmtrain train``: a single-peer run of the local training loop (strategy ``local`` by default).

Flags override ``SWARMTRAIN_*`` environment variables, which override the ``--config`` file; with
``--resume DIR`` the checkpoint's saved config is the lowest layer, so a bare ``--resume`` continues
the same run. Heavy imports (torch) happen inside the command so ``--help`` stays fast.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from swarmtrain.core.errors import ConfigError

__all__ = ["register", "train", "data_overrides"]


def data_overrides(paths: list[str]) -> dict[str, Any]:
    """``--data`` values -> ``data.paths``; the config infers ``data.source`` from them (all ``.bin`` or
    token folders: bin, else text), over any source a lower layer set for other paths."""
    return {"data.paths": list(paths)} if paths else {}


# the flags of ``train`` (unset: the lower layers' value)
_Config = Annotated[str | None, typer.Option("--config", "-c", help="TOML config file.")]
_Preset = Annotated[str | None, typer.Option("--preset", help="Model size: tiny, small or gpt2-124m.")]
_Steps = Annotated[int | None, typer.Option("--steps", help="Total optimizer steps (sets the LR schedule).")]
_MaxTime = Annotated[float | None, typer.Option("--max-time", help="Stop after this many seconds.")]
_BatchSize = Annotated[int | None, typer.Option("--batch-size", help="Sequences per micro-batch.")]
_GradAccum = Annotated[int | None, typer.Option("--grad-accum", help="Micro-batches per step.")]
_Lr = Annotated[float | None, typer.Option("--lr", help="Peak learning rate.")]
_Optimizer = Annotated[
    str | None,
    typer.Option(
        "--optimizer", help="Inner optimizer: adamw, adamw8bit (8-bit states; needs bitsandbytes) or sgd."
    ),
]
_Device = Annotated[str | None, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
_Compile = Annotated[bool | None, typer.Option("--compile/--no-compile", help="Use torch.compile.")]
_Data = Annotated[
    list[str] | None,
    typer.Option("--data", help="Text file/folder or .bin token file (repeatable); default: Python stdlib."),
]
_OutDir = Annotated[str | None, typer.Option("--out-dir", help="Where metrics and checkpoints go.")]
_Seed = Annotated[int | None, typer.Option("--seed", help="Seed of the init and the data order.")]
_Threads = Annotated[
    int | None, typer.Option("--threads", help="CPU threads for torch (default: all cores).")
]
_CheckpointInterval = Annotated[
    int | None,
    typer.Option("--checkpoint-interval", help="Save a checkpoint every N steps (always at the end)."),
]
_Resume = Annotated[str | None, typer.Option("--resume", help="Checkpoint folder to continue from.")]
_Progress = Annotated[bool | None, typer.Option("--progress/--no-progress", help="Show a progress bar.")]


def register(app: typer.Typer) -> None:
    """Add the ``train`` command to ``app``."""
    app.command("train")(train)


def train(
    config: _Config = None,
    preset: _Preset = None,
    steps: _Steps = None,
    max_time: _MaxTime = None,
    batch_size: _BatchSize = None,
    grad_accum: _GradAccum = None,
    lr: _Lr = None,
    optimizer: _Optimizer = None,
    device: _Device = None,
    compile_: _Compile = None,
    data: _Data = None,
    out_dir: _OutDir = None,
    seed: _Seed = None,
    threads: _Threads = None,
    checkpoint_interval: _CheckpointInterval = None,
    resume: _Resume = None,
    progress: _Progress = None,
) -> None:
    """Train a byte-level GPT on this machine alone.

    With no options: the tiny preset on the Python standard library's sources, on CUDA when
    available. Prints the final train/val loss and where metrics and the checkpoint went.
    """
    from swarmtrain.core.config import load_config

    overrides: dict[str, Any] = {
        "model.preset": preset,
        "train.steps": steps,
        "train.max_time": max_time,
        "train.batch_size": batch_size,
        "train.grad_accum": grad_accum,
        "train.lr": lr,
        "train.optimizer": optimizer,
        "train.device": device,
        "train.compile": compile_,
        "train.out_dir": out_dir,
        "train.seed": seed,
        "train.threads": threads,
        "train.checkpoint_interval": checkpoint_interval,
        "train.progress": progress,
    }
    overrides.update(data_overrides(list(data or [])))
    base = _resumed_config(resume) if resume is not None else None
    cfg = load_config(config, overrides, base=base)
    _run(cfg, resume)


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
