"""Data-level attack: label flipping (e.g. Tolpegin et al. 2020; BTARD's "label flipping").

The attacker trains honestly on poisoned targets, so its update looks like an ordinary update of a
different task. For byte-level language modelling the flip maps each target byte ``b`` to
``vocab - 1 - b`` (for bytes: ``255 - b``).

A real peer runs it through ``PoisonedBatches``: a wrapper around the trainer's batch sampler that
applies ``transform_batch`` to every batch it hands out, so the trainer itself has no attack code.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from swarmtrain.core.errors import ConfigError
from swarmtrain.simulation.attacks.base import ATTACKS, Attack

__all__ = ["LabelFlip", "flip_labels", "PoisonedBatches", "BatchSource"]


def flip_labels(targets: torch.Tensor, vocab_size: int = 256) -> torch.Tensor:
    """Map each class ``y`` to ``vocab_size - 1 - y``; entries < 0 (ignore index) stay as they are.

    Raises:
        ConfigError: non-integer targets, or a target ``>= vocab_size``.
    """
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise ConfigError(f"label flip: targets must be integer class ids, got {targets.dtype}")
    if targets.numel() and int(targets.max()) >= vocab_size:
        raise ConfigError(f"label flip: a target is >= vocab_size={vocab_size}")
    return torch.where(targets >= 0, vocab_size - 1 - targets, targets)


@ATTACKS.register("label_flip")
class LabelFlip(Attack):
    """Train on flipped targets (``transform_batch``); the update is then sent unchanged.

    Args:
        vocab_size: number of classes (256 for byte-level data).
    """

    name = "label_flip"
    data_level = True

    def __init__(self, vocab_size: int = 256) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 2:
            raise ConfigError(f"attack 'label_flip': vocab_size must be an int >= 2, got {vocab_size!r}")
        self.vocab_size = vocab_size

    def transform_batch(
        self, inputs: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return inputs, flip_labels(targets, self.vocab_size)

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "vocab_size": self.vocab_size}


class BatchSource(Protocol):
    """What ``PoisonedBatches`` wraps: a sampler that returns ``(inputs, targets)`` per position."""

    def get(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]: ...


class PoisonedBatches:
    """A batch sampler whose batches pass through ``attack.transform_batch`` (a data-level attack).

    Every other attribute (``identity()``, ``starts()``, ...) is the wrapped sampler's, so
    checkpoints and logs see the same stream description.

    Args:
        inner: the honest sampler (``swarmtrain.app.data.BatchSampler``).
        attack: a data-level ``Attack`` (e.g. ``LabelFlip``).

    Raises:
        ConfigError: the attack does not act on data.
    """

    def __init__(self, inner: BatchSource, attack: Attack) -> None:
        if not attack.data_level:
            raise ConfigError(f"attack {attack.name!r} does not act on training data")
        self.inner = inner
        self.attack = attack
        self.batches = 0

    def get(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The wrapped sampler's batch, poisoned."""
        x, y = self.inner.get(step, micro)
        self.batches += 1
        return self.attack.transform_batch(x, y)

    def __getattr__(self, name: str) -> Any:
        # only called for attributes this wrapper lacks: delegate to the honest sampler
        if name in ("inner", "attack", "batches"):
            raise AttributeError(name)
        return getattr(self.inner, name)
