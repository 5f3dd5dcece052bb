"""Reducers: combine one flat row per peer into one aggregate (pure functions of the stack).

Registered by name in ``REDUCERS``; the partition owner in the all-reduce applies one.
"""

from __future__ import annotations

import torch

from swarmtrain.errors import ConfigError
from swarmtrain.registry import Registry

__all__ = ["REDUCERS", "MeanReducer", "build_reducer"]

REDUCERS: Registry[type] = Registry("reducer")


@REDUCERS.register("mean")
class MeanReducer:
    """Weighted mean ``sum_i w_i x_i / sum_i w_i``. Breakdown point 0: one bad row moves it anywhere."""

    name = "mean"

    def __init__(self, n_byzantine: int = 0) -> None:
        if n_byzantine:
            raise ConfigError("reducer 'mean' tolerates no Byzantine peers; choose a robust reducer")

    def reduce(self, stack: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        # stack: [n, m]; weights: [n]
        w = weights.to(stack.dtype)
        total = w.sum()
        if not torch.isfinite(total) or total <= 0:
            raise ConfigError("reducer weights must be finite and sum to a positive number")
        return (w[:, None] * stack).sum(0) / total


def build_reducer(name: str, n_byzantine: int = 0) -> MeanReducer:
    """Instantiate the reducer ``name`` for ``n_byzantine`` tolerated attackers."""
    cls = REDUCERS.get(name)
    return cls(n_byzantine=n_byzantine)  # type: ignore[no-any-return]
