"""A trainer's state in and out: checkpoints that resume bit-exactly (model, optimizer, strategy, data
position, RNG states and counters) and the adoption of another peer's state (a newcomer's download,
a late peer's catch-up). Every check runs before anything changes, so a state that does not fit
leaves the trainer as it was. ``Trainer`` exposes these as its methods."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from swarmtrain.app.data import BatchSampler, Corpus
from swarmtrain.app.models import GPT
from swarmtrain.app.train.checkpoint import (
    CheckpointError,
    read_checkpoint,
    rng_state,
    set_rng_state,
    write_checkpoint,
)
from swarmtrain.app.train.inner_optim import check_optimizer_state
from swarmtrain.app.train.state_checks import check_finite_state, check_fits
from swarmtrain.core import __version__
from swarmtrain.core.config import Config
from swarmtrain.core.protocols import Strategy

__all__ = ["save_checkpoint", "load_checkpoint", "load_peer_state", "load_strategy_state", "named_state"]

logger = logging.getLogger(__name__)


class Trainer(Protocol):
    """The parts of a ``swarmtrain.app.train.trainer.Trainer`` its state is made of."""

    config: Config
    model: GPT
    optimizer: torch.optim.Optimizer
    strategy: Strategy
    sampler: BatchSampler
    corpus: Corpus
    step: int
    tokens: int
    wall_s: float
    _fit_elapsed: float  # wall time of the running fit() call at its last checkpoint
    bytes_sent: int
    bytes_received: int


def named_state(trainer: Trainer) -> Iterator[tuple[str, torch.Tensor]]:
    yield from trainer.model.named_parameters()  # the tied head appears once
    yield from trainer.model.named_buffers()


def save_checkpoint(trainer: Trainer, directory: str | Path) -> Path:
    """Write model, optimizer, strategy, data position, RNG states and counters to ``directory``."""
    state = {
        "kind": "swarmtrain.trainer",
        "version": __version__,
        "config": trainer.config.model_dump(mode="json"),
        "model": dict(named_state(trainer)),
        "optimizer": trainer.optimizer.state_dict(),
        "optimizer_kind": trainer.config.train.optimizer,
        "strategy": {"name": trainer.strategy.name, "state": trainer.strategy.state_dict()},
        "rng": rng_state(),
        "data": {
            "step": trainer.step,
            "sampler": trainer.sampler.identity(),
            "corpus": trainer.corpus.fingerprint,
        },
        "progress": {
            "step": trainer.step,
            "tokens": trainer.tokens,
            "wall_s": trainer.wall_s + trainer._fit_elapsed,
            "bytes_sent": trainer.bytes_sent,
            "bytes_received": trainer.bytes_received,
        },
    }
    path = write_checkpoint(directory, state)
    logger.info("saved checkpoint at step %d to %s", trainer.step, path)
    return path


def load_checkpoint(trainer: Trainer, directory: str | Path) -> None:
    """Restore everything :func:`save_checkpoint` wrote; the next step continues bit-exactly.

    Raises:
        CheckpointError: unreadable checkpoint, or one whose tensors do not fit this model.
    """
    state = read_checkpoint(directory)
    if state.get("kind") != "swarmtrain.trainer":
        raise CheckpointError(f"{directory} is not a swarmtrain trainer checkpoint")
    try:
        model_state, progress = state["model"], state["progress"]
        opt_state, strat, data = state["optimizer"], state["strategy"], state["data"]
    except KeyError as e:
        raise CheckpointError(f"{directory}: checkpoint lacks {e}") from None
    kind = trainer.config.train.optimizer
    saved_kind = state.get("optimizer_kind", kind)  # checkpoints before adamw8bit did not name it
    try:  # every check before anything changes: a checkpoint that does not fit leaves all as it was
        counters = (
            int(progress["step"]),
            int(progress["tokens"]),
            float(progress["wall_s"]),
            int(progress["bytes_sent"]),
            int(progress["bytes_received"]),
        )
        rng = state["rng"]
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{directory}: checkpoint progress is incomplete: {e}") from None
    try:
        check_fits(dict(named_state(trainer)), model_state)
        if saved_kind != kind:
            raise CheckpointError(f"it holds {saved_kind} optimizer state, this run uses {kind}")
        check_optimizer_state(trainer.optimizer, kind, opt_state)
    except CheckpointError as e:
        raise CheckpointError(f"{directory}: {e}") from None
    if strat.get("name") == trainer.strategy.name:
        try:
            load_strategy_state(trainer, strat["state"])  # restores its own state if it fails
        except CheckpointError as e:
            raise CheckpointError(f"{directory}: {e}") from None
    else:
        logger.warning(
            "checkpoint strategy %r differs from %r: its strategy state is not restored",
            strat.get("name"),
            trainer.strategy.name,
        )
    copy_into_model(named_state(trainer), model_state)
    try:
        trainer.optimizer.load_state_dict(opt_state)
    except (ValueError, KeyError, TypeError, RuntimeError) as e:  # pragma: no cover - checked above
        raise CheckpointError(f"{directory}: optimizer state does not fit: {e}") from None
    if data.get("sampler") != trainer.sampler.identity():
        logger.warning("data sampling changed since the checkpoint: the batch stream will differ")
    if data.get("corpus") != trainer.corpus.fingerprint:
        logger.warning("the corpus changed since the checkpoint")
    set_rng_state(rng)
    trainer.step, trainer.tokens, trainer.wall_s, trainer.bytes_sent, trainer.bytes_received = counters
    logger.info("resumed from %s at step %d", directory, trainer.step)


def load_peer_state(
    trainer: Trainer,
    parameters: Mapping[str, torch.Tensor],
    strategy_state: Any,
    step: int,
    optimizer_state: Any = None,
) -> None:
    """Adopt another peer's parameters, strategy state, step count and (when given) inner optimizer
    state: a newcomer's download or a late peer's catch-up. RNG and data stream stay this peer's.

    Only the optimizer's per-parameter state is taken from the donor (moments, 8-bit codes and
    their scales, step counts); its hyperparameters (lr, betas, weight decay) stay this peer's own
    config, so a donor cannot change how this peer trains.

    Raises:
        CheckpointError: the parameters, the strategy state or the optimizer state do not fit this
            trainer (another optimizer kind, shapes, dtypes, non-finite values); nothing changed then.
    """
    check_fits(dict(trainer.model.named_parameters()), parameters)
    check_finite_state(dict(parameters), "parameters")
    check_finite_state(strategy_state, "strategy state")  # anchors, momenta, outer lr...
    if optimizer_state is not None:
        check_optimizer_state(trainer.optimizer, trainer.config.train.optimizer, optimizer_state)
        check_finite_state(optimizer_state.get("state", {}), "optimizer state")
    model_backup = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    opt_backup = trainer.optimizer.state_dict() if optimizer_state is not None else None
    load_strategy_state(trainer, strategy_state)  # restores itself if it fails
    try:
        copy_into_model(trainer.model.named_parameters(), parameters)
        if optimizer_state is not None:
            ours = trainer.optimizer.state_dict()["param_groups"]
            theirs = optimizer_state["param_groups"]
            groups = [{**g, "params": s["params"]} for g, s in zip(ours, theirs, strict=True)]
            trainer.optimizer.load_state_dict({"state": optimizer_state["state"], "param_groups": groups})
    except Exception as e:  # the donor's bytes: leave everything as it was
        copy_into_model(trainer.model.named_parameters(), model_backup)
        if opt_backup is not None:
            trainer.optimizer.load_state_dict(opt_backup)
        raise CheckpointError(f"state does not load: {type(e).__name__}: {e}") from None
    trainer.step = step


def load_strategy_state(trainer: Trainer, state: Any) -> None:
    """Load ``state`` into the strategy, or leave the strategy as it was and raise CheckpointError."""
    backup = trainer.strategy.state_dict()
    try:
        trainer.strategy.load_state_dict(state)
    except Exception as e:  # a malformed state from a file or a peer, whatever it raised
        trainer.strategy.load_state_dict(backup)
        raise CheckpointError(f"strategy state does not fit: {type(e).__name__}: {e}") from None


@torch.no_grad()
def copy_into_model(ours: Iterable[tuple[str, torch.Tensor]], theirs: Mapping[str, torch.Tensor]) -> None:
    for name, t in ours:
        t.copy_(theirs[name])
