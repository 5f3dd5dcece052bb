"""Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer 2017, "Machine Learning with
Adversaries: Byzantine Tolerant Gradient Descent")."""

from __future__ import annotations

import torch

from peers.reducers.base import REDUCERS, BaseReducer, row_sq_distances
from swarmtrain.core.errors import ConfigError

__all__ = ["Krum", "MultiKrum", "krum_scores"]


def krum_scores(stack: torch.Tensor, f: int) -> torch.Tensor:
    """``[n]`` Krum scores: each row's sum of squared distances to its ``n - f - 2`` nearest other rows.

    Distances are computed directly as ``||x_i - x_j||^2`` (one pass per row, in column chunks), not
    through the Gram matrix, so nearby rows keep their precision.
    """
    n = stack.shape[0]
    d2 = torch.stack([row_sq_distances(stack, stack[i]) for i in range(n)])  # [n, n]
    d2.fill_diagonal_(float("inf"))  # a row is not its own neighbour
    k = n - f - 2
    nearest = torch.sort(d2, dim=1).values[:, :k]  # [n, k]
    return nearest.sum(dim=1)


def _ranking(scores: torch.Tensor) -> torch.Tensor:
    # A stable sort breaks ties by row index, so every peer picks the same rows.
    return torch.sort(scores, stable=True).indices


class _KrumBase(BaseReducer):
    def min_peers(self, f: int) -> int:
        return 2 * f + 3


@REDUCERS.register("krum")
class Krum(_KrumBase):
    """Return the single row with the lowest Krum score.

    Breakdown: tolerates ``f`` Byzantine rows when ``n >= 2f + 3`` (``n > 2f + 2`` in the paper);
    refuses fewer. The output is always one submitted row, so it is bounded whenever the chosen row
    is honest or close to the honest ones. Weights are ignored (claimed by untrusted peers).

    Args:
        n_byzantine: ``f``, the number of Byzantine rows to tolerate.
    """

    name = "krum"

    def _reduce(
        self, stack: torch.Tensor, weights: torch.Tensor, f: int, reference: torch.Tensor | None
    ) -> torch.Tensor:
        best = int(_ranking(krum_scores(stack, f))[0])
        return stack[best].clone()


@REDUCERS.register("multi_krum")
class MultiKrum(_KrumBase):
    """Average the ``select`` rows with the lowest Krum scores (scores computed once).

    Breakdown: as Krum, ``n >= 2f + 3``. ``select`` defaults to ``n - f`` and must not exceed it.
    Weights are ignored (claimed by untrusted peers).

    Args:
        n_byzantine: ``f``, the number of Byzantine rows to tolerate.
        select: how many rows to average (``None``: ``n - f``).
    """

    name = "multi_krum"

    def __init__(self, n_byzantine: int = 0, select: int | None = None) -> None:
        super().__init__(n_byzantine)
        if select is not None and (isinstance(select, bool) or not isinstance(select, int) or select < 1):
            raise ConfigError(f"reducer 'multi_krum': select must be an int >= 1, got {select!r}")
        self.select = select

    def min_peers(self, f: int) -> int:
        need = 2 * f + 3
        if self.select is not None:
            need = max(need, self.select + f)
        return need

    def _reduce(
        self, stack: torch.Tensor, weights: torch.Tensor, f: int, reference: torch.Tensor | None
    ) -> torch.Tensor:
        n = stack.shape[0]
        k = n - f if self.select is None else min(self.select, n - f)
        chosen = torch.sort(_ranking(krum_scores(stack, f))[:k]).values  # fixed summation order
        return stack[chosen].sum(dim=0) / k
