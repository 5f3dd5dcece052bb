"""Coordinate-wise median (Yin, Chen, Ramchandran, Bartlett 2018, "Byzantine-Robust Distributed
Learning: Towards Optimal Statistical Rates")."""

from __future__ import annotations

import torch

from peers.reducers.base import REDUCERS, BaseReducer, coordinate_median_of

__all__ = ["CoordinateMedian"]


@REDUCERS.register("coordinate_median")
class CoordinateMedian(BaseReducer):
    """Per coordinate, the median of the ``n`` values (the mean of the two middle ones for even ``n``).

    Breakdown point 1/2: with ``f`` arbitrary rows and ``n >= 2f + 1`` every coordinate of the result
    lies between two honest values of that coordinate, so it stays bounded whatever the attackers
    send. Refuses ``n < 2f + 1``. Weights are ignored (they are claimed by untrusted peers).

    Args:
        n_byzantine: ``f``, the number of Byzantine rows to tolerate.
    """

    name = "coordinate_median"

    def min_peers(self, f: int) -> int:
        return 2 * f + 1

    def _reduce(
        self, stack: torch.Tensor, weights: torch.Tensor, f: int, reference: torch.Tensor | None
    ) -> torch.Tensor:
        return coordinate_median_of(stack)
