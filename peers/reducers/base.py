"""Shared machinery of the reducers: the registry, input validation, breakdown checks, column chunks.

Every reducer maps a stack ``[n_peers, m]`` (one flat row per peer) and weights ``[n_peers]`` to one
``[m]`` aggregate (docs/architecture.md, Interfaces). ``BaseReducer`` does what all of them need:

* validates shapes and dtypes (a typed ``ConfigError`` for a caller bug);
* refuses an ``(n, f)`` outside the reducer's breakdown point (``check``), before any work;
* drops rows holding NaN/Inf: such a row can only come from a faulty or Byzantine peer, so it is
  counted against ``f`` (more than ``f`` of them raise ``UpdateRejected``) and the remaining rows are
  reduced with ``f`` lowered by the number dropped. This keeps the breakdown condition valid, since
  every condition used here has the form ``n >= a*f + b`` with ``a >= 1``;
* computes in float32 for half-precision inputs and returns the input dtype.

Robust reducers treat every row alike and ignore the weights (after validating them): weights are
claimed by the peers themselves, and a Byzantine peer claiming a huge weight would otherwise buy
itself votes. Only ``mean`` uses them.

Work that touches all ``n * m`` numbers is done on column chunks of about ``CHUNK_ELEMENTS`` values
so that temporaries stay small for partitions of millions of values; the chunk size is fixed, which
keeps the summation order, and so the result, bit-identical from run to run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from swarmtrain.core.errors import ConfigError, UpdateRejected
from swarmtrain.core.registry import Registry

__all__ = [
    "REDUCERS",
    "BaseReducer",
    "CHUNK_ELEMENTS",
    "column_chunks",
    "map_columns",
    "row_sq_distances",
    "coordinate_median_of",
]

REDUCERS: Registry[type] = Registry("reducer")

#: Temporaries of reducers hold at most about this many elements per chunk of columns.
CHUNK_ELEMENTS = 1 << 22

_HALF = (torch.float16, torch.bfloat16)


def column_chunks(n: int, m: int) -> list[slice]:
    """Column slices covering ``range(m)`` whose ``[n, chunk]`` blocks hold about ``CHUNK_ELEMENTS``."""
    width = max(1, CHUNK_ELEMENTS // max(1, n))
    return [slice(start, min(m, start + width)) for start in range(0, m, width)]


def map_columns(fn: Callable[[torch.Tensor], torch.Tensor], stack: torch.Tensor) -> torch.Tensor:
    """Apply a column-wise ``fn: [n, c] -> [c]`` chunk by chunk and concatenate the results."""
    n, m = stack.shape
    out = torch.empty(m, dtype=stack.dtype, device=stack.device)
    for cols in column_chunks(n, m):
        out[cols] = fn(stack[:, cols])
    return out


def row_sq_distances(stack: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[n]`` squared Euclidean distances ``||stack[i] - v||^2``, computed directly (no Gram trick)."""
    n, m = stack.shape
    d2 = torch.zeros(n, dtype=stack.dtype, device=stack.device)
    for cols in column_chunks(n, m):
        d2 += (stack[:, cols] - v[cols]).square().sum(dim=1)
    return d2


def coordinate_median_of(stack: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise median of a ``[n, m]`` stack; for even ``n`` the mean of the two middle values."""
    n = stack.shape[0]

    def med(block: torch.Tensor) -> torch.Tensor:
        s = torch.sort(block, dim=0).values
        if n % 2 == 1:
            return s[n // 2]
        return (s[n // 2 - 1] + s[n // 2]) * 0.5

    return map_columns(med, stack)


class BaseReducer:
    """Validation, breakdown check and NaN/Inf-row handling around a reducer's ``_reduce``.

    Subclasses set ``name``, implement ``min_peers(f)`` (the smallest ``n`` they can handle with
    ``f`` Byzantine rows) and ``_reduce(stack, weights, f, reference)``.

    Args:
        n_byzantine: ``f``, the number of arbitrary (Byzantine) rows the reducer must tolerate.
    """

    name = "base"

    def __init__(self, n_byzantine: int = 0) -> None:
        if isinstance(n_byzantine, bool) or not isinstance(n_byzantine, int) or n_byzantine < 0:
            raise ConfigError(f"reducer {self.name!r}: n_byzantine must be an int >= 0, got {n_byzantine!r}")
        self.n_byzantine = n_byzantine

    def min_peers(self, f: int) -> int:
        """Smallest number of rows for which ``f`` Byzantine rows are within the breakdown point."""
        raise NotImplementedError

    def check(self, n: int) -> None:
        """Raise ``ConfigError`` unless ``n`` rows with ``n_byzantine`` attackers are within bounds."""
        need = self.min_peers(self.n_byzantine)
        if n < need:
            raise ConfigError(
                f"reducer {self.name!r} cannot tolerate f={self.n_byzantine} Byzantine peers among "
                f"n={n}: it needs n >= {need}"
            )

    def reduce(self, stack: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Aggregate ``stack`` ``[n, m]`` with ``weights`` ``[n]`` into ``[m]``.

        Raises:
            ConfigError: bad shapes/dtypes/weights, or ``(n, f)`` beyond the breakdown point.
            UpdateRejected: more rows hold NaN/Inf than the ``f`` the reducer tolerates.
        """
        return self._run(stack, weights, None)

    def _run(
        self, stack: torch.Tensor, weights: torch.Tensor, reference: torch.Tensor | None
    ) -> torch.Tensor:
        stack, weights = self._validate(stack, weights)
        n = stack.shape[0]
        self.check(n)
        out_dtype = stack.dtype
        if out_dtype in _HALF:
            stack = stack.float()
        finite = torch.isfinite(stack).all(dim=1)  # [n]
        n_bad = n - int(finite.sum().item())
        f = self.n_byzantine
        if n_bad:
            if n_bad > f:
                raise UpdateRejected(
                    f"reducer {self.name!r}: {n_bad} of {n} rows hold NaN/Inf, more than f={f}"
                )
            stack, weights, f = stack[finite], weights[finite], f - n_bad
        if stack.shape[1] == 0:
            return stack.new_zeros(0).to(out_dtype)
        return self._reduce(stack, weights, f, reference).to(out_dtype)

    def _reduce(
        self, stack: torch.Tensor, weights: torch.Tensor, f: int, reference: torch.Tensor | None
    ) -> torch.Tensor:
        """Reduce finite rows; ``f`` is the Byzantine count left after dropping NaN/Inf rows."""
        raise NotImplementedError

    def _validate(self, stack: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(stack, torch.Tensor) or stack.dim() != 2:
            raise ConfigError(f"reducer {self.name!r}: stack must be a [n_peers, m] tensor")
        if not stack.is_floating_point():
            raise ConfigError(f"reducer {self.name!r}: stack must be floating point, got {stack.dtype}")
        n = stack.shape[0]
        if n == 0:
            raise ConfigError(f"reducer {self.name!r}: no rows to reduce")
        if not isinstance(weights, torch.Tensor) or weights.shape != (n,):
            raise ConfigError(f"reducer {self.name!r}: weights must have shape [{n}]")
        wdtype = torch.float64 if stack.dtype == torch.float64 else torch.float32
        weights = weights.to(device=stack.device, dtype=wdtype)
        if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
            raise ConfigError(f"reducer {self.name!r}: weights must be finite and non-negative")
        return stack, weights

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_byzantine={self.n_byzantine})"
