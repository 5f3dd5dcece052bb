"""Coordinate-wise trimmed mean (Yin, Chen, Ramchandran, Bartlett 2018, "Byzantine-Robust Distributed
Learning: Towards Optimal Statistical Rates")."""

from __future__ import annotations

import torch

from peers.reducers.base import REDUCERS, BaseReducer, map_columns
from swarmtrain.core.errors import ConfigError

__all__ = ["TrimmedMean"]


@REDUCERS.register("trimmed_mean")
class TrimmedMean(BaseReducer):
    """Per coordinate, drop the ``b`` largest and ``b`` smallest values and average the rest.

    Breakdown point 1/2: with ``b >= f`` every kept value of a coordinate lies between two honest
    values, so the result stays bounded. Refuses ``n < 2b + 1``. Weights are ignored (claimed by
    untrusted peers).

    Args:
        n_byzantine: ``f``, the number of Byzantine rows to tolerate.
        trim: ``b``, values cut from each side (default ``f``; must be ``>= f``).
    """

    name = "trimmed_mean"

    def __init__(self, n_byzantine: int = 0, trim: int | None = None) -> None:
        super().__init__(n_byzantine)
        b = n_byzantine if trim is None else trim
        if isinstance(b, bool) or not isinstance(b, int) or b < n_byzantine:
            raise ConfigError(f"reducer 'trimmed_mean': trim must be an int >= n_byzantine={n_byzantine}")
        self.trim = b

    def min_peers(self, f: int) -> int:
        return 2 * max(self.trim, f) + 1

    def _reduce(
        self, stack: torch.Tensor, weights: torch.Tensor, f: int, reference: torch.Tensor | None
    ) -> torch.Tensor:
        n = stack.shape[0]
        # Rows dropped for NaN/Inf were Byzantine, so fewer honest-looking extremes remain to cut.
        b = self.trim - (self.n_byzantine - f)

        def trimmed(block: torch.Tensor) -> torch.Tensor:
            s = torch.sort(block, dim=0).values  # [n, c]
            return s[b : n - b].sum(dim=0) / (n - 2 * b)

        return map_columns(trimmed, stack)
