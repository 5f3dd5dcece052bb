"""Geometric median by the smoothed Weiszfeld iteration (Weiszfeld 1937; as used for federated
learning in Pillutla, Kakade, Harchaoui 2022, "Robust Aggregation for Federated Learning", RFA)."""

from __future__ import annotations

import math

import torch

from peers.reducers.base import REDUCERS, BaseReducer, column_chunks, coordinate_median_of, row_sq_distances
from swarmtrain.core.errors import ConfigError

__all__ = ["GeometricMedian"]


@REDUCERS.register("geometric_median")
class GeometricMedian(BaseReducer):
    """The point minimising ``sum_i ||x_i - z||``, by Weiszfeld's iteration.

    ``z <- sum_i b_i x_i / sum_i b_i`` with ``b_i = 1 / max(nu, ||x_i - z||)``, started from the
    coordinate median. ``nu = smoothing * (median distance to the start)`` keeps the step defined when
    ``z`` lands on a row and makes the smoothing scale-free. Stops when the step's norm is at most
    ``tol`` times that median distance, or after ``max_iters`` iterations.

    Breakdown point 1/2: refuses ``n < 2f + 1``. Weights are ignored (claimed by untrusted peers).

    Args:
        n_byzantine: ``f``, the number of Byzantine rows to tolerate.
        max_iters: iteration cap.
        tol: relative stopping tolerance.
        smoothing: relative smoothing ``nu``.
    """

    name = "geometric_median"

    def __init__(
        self, n_byzantine: int = 0, max_iters: int = 100, tol: float = 1e-6, smoothing: float = 1e-6
    ) -> None:
        super().__init__(n_byzantine)
        if isinstance(max_iters, bool) or not isinstance(max_iters, int) or max_iters < 1:
            raise ConfigError(f"reducer 'geometric_median': max_iters must be an int >= 1, got {max_iters!r}")
        for label, value in (("tol", tol), ("smoothing", smoothing)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"reducer 'geometric_median': {label} must be finite and >= 0")
        self.max_iters = max_iters
        self.tol = tol
        self.smoothing = smoothing
        self.last_iters = 0  # diagnostics only: iterations the last call ran

    def min_peers(self, f: int) -> int:
        return 2 * f + 1

    def _reduce(
        self, stack: torch.Tensor, weights: torch.Tensor, f: int, reference: torch.Tensor | None
    ) -> torch.Tensor:
        n, m = stack.shape
        z = coordinate_median_of(stack)
        dist = row_sq_distances(stack, z).sqrt()  # [n]
        scale = float(torch.quantile(dist.double(), 0.5, interpolation="lower"))
        self.last_iters = 0
        if scale <= 0.0:  # at least half the rows coincide with the start point: it is the minimiser
            return z
        nu = max(self.smoothing * scale, torch.finfo(stack.dtype).tiny)
        for it in range(self.max_iters):
            beta = 1.0 / dist.clamp_min(nu)  # [n]
            beta = beta / beta.sum()
            # z_new - z = sum_i beta_i (x_i - z), computed directly so z keeps its precision.
            step = torch.empty_like(z)
            for cols in column_chunks(n, m):
                step[cols] = (beta[:, None] * (stack[:, cols] - z[cols])).sum(dim=0)
            z = z + step
            self.last_iters = it + 1
            if float(torch.linalg.vector_norm(step)) <= self.tol * scale:
                break
            dist = row_sq_distances(stack, z).sqrt()
        return z
