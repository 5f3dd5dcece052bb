"""The weighted mean: the plain (non-robust) reducer every comparison starts from."""

from __future__ import annotations

import torch

from peers.reducers.base import REDUCERS, BaseReducer
from swarmtrain.core.errors import ConfigError

__all__ = ["MeanReducer"]


@REDUCERS.register("mean")
class MeanReducer(BaseReducer):
    """Weighted mean ``sum_i w_i x_i / sum_i w_i``.

    Breakdown point 0: one bad row moves it anywhere, so it refuses any ``n_byzantine > 0`` (a
    benchmark that shows the mean failing under attack builds it with ``n_byzantine=0``). A row with
    NaN/Inf raises ``UpdateRejected``.

    Args:
        n_byzantine: must be 0.
    """

    name = "mean"

    def __init__(self, n_byzantine: int = 0) -> None:
        super().__init__(n_byzantine)
        if n_byzantine:
            raise ConfigError("reducer 'mean' tolerates no Byzantine peers; choose a robust reducer")

    def min_peers(self, f: int) -> int:
        return 1

    def _reduce(
        self, stack: torch.Tensor, weights: torch.Tensor, f: int, reference: torch.Tensor | None
    ) -> torch.Tensor:
        # stack: [n, m]; weights: [n]
        w = weights.to(stack.dtype)
        total = w.sum()
        if not bool(torch.isfinite(total)) or total <= 0:
            raise ConfigError("reducer 'mean': weights must be finite and sum to a positive number")
        return (w / total) @ stack
