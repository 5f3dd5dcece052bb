"""Learning-rate schedule: linear warmup then cosine decay to a floor (Loshchilov & Hutter 2017, SGDR)."""

from __future__ import annotations

import math

from swarmtrain.core.config import TrainConfig

__all__ = ["lr_at"]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for the 0-based ``step`` of a run of ``cfg.steps`` steps.

    Linear warmup over ``warmup_steps`` (from ``lr / warmup_steps`` up to ``lr``), then a half cosine
    from ``lr`` down to ``min_lr`` at the last step; ``min_lr`` after that (a run extended by resume).
    """
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(cfg.steps - cfg.warmup_steps, 1)
    progress = min(max((step - cfg.warmup_steps) / span, 0.0), 1.0)
    floor = min(cfg.min_lr, cfg.lr)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - floor)
