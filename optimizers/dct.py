"""Chunked orthonormal DCT-II, the transform DeMo uses to find a tensor's fast-moving components.

Peng, Quesnelle, Kingma 2024, "DeMo: Decoupled Momentum Optimization", section 3: a tensor is cut
into chunks (1-D chunks for vectors, 2-D tiles for matrices) and each chunk is transformed with the
type-II discrete cosine transform; the largest coefficients of each chunk are what DeMo transmits.

The chunk length along a dimension of size ``s`` is the largest divisor of ``s`` not above the target
(so chunks tile the tensor exactly). Tensors of more than two dimensions are viewed as
``(shape[0], prod(shape[1:]))``; scalars as a vector of one element. The transform is orthonormal,
so ``decode(encode(x)) == x`` up to rounding and the same basis is used on every peer.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from swarmtrain.core.errors import ConfigError

__all__ = ["chunk_length", "dct_matrix", "ChunkedDCT"]


def chunk_length(size: int, target: int) -> int:
    """Largest divisor of ``size`` that is ``<= target`` (``size`` itself when it is small enough)."""
    if size < 1 or target < 1:
        raise ConfigError(f"chunk_length needs positive sizes, got size={size}, target={target}")
    if size <= target:
        return size
    for c in range(target, 0, -1):
        if size % c == 0:
            return c
    return 1  # pragma: no cover - 1 always divides


@lru_cache(maxsize=64)
def _dct_matrix64(n: int) -> torch.Tensor:
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    m = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    m[0] /= math.sqrt(2.0)
    return m


def dct_matrix(
    n: int, dtype: torch.dtype = torch.float32, device: torch.device | None = None
) -> torch.Tensor:
    """The ``[n, n]`` orthonormal DCT-II matrix ``C`` (``coeffs = C @ x``, ``x = C.T @ coeffs``)."""
    return _dct_matrix64(n).to(dtype=dtype, device=device)


class ChunkedDCT:
    """The chunked DCT of one tensor shape.

    Args:
        shape: the tensor's shape.
        target: target chunk length per dimension (``strategy.demo_chunk``).

    Attributes:
        n_chunks: number of chunks.
        chunk_numel: coefficients per chunk (``h`` for vectors, ``h * w`` for matrices).
    """

    def __init__(self, shape: tuple[int, ...], target: int) -> None:
        self.shape = tuple(int(s) for s in shape)
        numel = math.prod(self.shape)
        if numel == 0:
            raise ConfigError(f"cannot transform an empty tensor of shape {self.shape}")
        if len(self.shape) <= 1:
            self.view: tuple[int, ...] = (numel,)
            self.h = chunk_length(numel, target)
            self.w = 1
            self.n_chunks = numel // self.h
        else:
            rows, cols = self.shape[0], numel // self.shape[0]
            self.view = (rows, cols)
            self.h = chunk_length(rows, target)
            self.w = chunk_length(cols, target)
            self.n_chunks = (rows // self.h) * (cols // self.w)
        self.chunk_numel = self.h * self.w

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (``shape``) -> coefficients ``[n_chunks, chunk_numel]``."""
        ch = dct_matrix(self.h, x.dtype, x.device)
        if len(self.view) == 1:
            return x.reshape(self.n_chunks, self.h) @ ch.T
        rows, cols = self.view
        tiles = x.reshape(rows // self.h, self.h, cols // self.w, self.w).permute(0, 2, 1, 3)
        cw = dct_matrix(self.w, x.dtype, x.device)
        coeffs = ch @ tiles @ cw.T  # [Y, X, h, w]
        return coeffs.reshape(self.n_chunks, self.chunk_numel)

    def decode(self, coeffs: torch.Tensor) -> torch.Tensor:
        """Coefficients ``[n_chunks, chunk_numel]`` -> tensor of ``shape``."""
        ch = dct_matrix(self.h, coeffs.dtype, coeffs.device)
        if len(self.view) == 1:
            return (coeffs @ ch).reshape(self.shape)
        rows, cols = self.view
        tiles = coeffs.reshape(rows // self.h, cols // self.w, self.h, self.w)
        cw = dct_matrix(self.w, coeffs.dtype, coeffs.device)
        x = ch.T @ tiles @ cw  # [Y, X, h, w]
        return x.permute(0, 2, 1, 3).reshape(self.shape)
