"""Top-k sparsification (Aji & Heafield, "Sparse Communication for Distributed Gradient Descent",
2017; Stich et al., "Sparsified SGD with Memory", 2018): send the ``k`` largest-magnitude elements.

Indices travel sorted ascending in the narrowest unsigned type that can address the tensor (uint8 up
to 256 elements, uint16 up to 65,536, else uint32); values travel through any other codec, e.g.
``topk+int8``. The decoder requires strictly increasing indices below ``numel``, which also rules out
duplicates (whose scatter order would differ between devices).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from compression.base import CODECS, Codec, check_packet, dtype_name, int_param
from compression.cast import NoneCompressor
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.packet import Packet

__all__ = ["TopKCompressor", "index_dtype"]


def index_dtype(numel: int) -> np.dtype:
    """The little-endian unsigned numpy dtype used for indices into ``numel`` elements."""
    if numel <= 1 << 8:
        return np.dtype("u1")
    if numel <= 1 << 16:
        return np.dtype("<u2")
    if numel <= 1 << 32:
        return np.dtype("<u4")
    raise ProtocolError(f"topk: {numel} elements cannot be indexed with 32 bits")


@CODECS.register("topk")
class TopKCompressor(Codec):
    """Keep the ``k`` largest-magnitude elements; the rest decode to zero.

    Size: ``k * index_bytes + inner.payload_nbytes(k)`` with ``index_bytes`` 1, 2 or 4 (see
    ``index_dtype``). Error bound: the dropped elements are each at most the k-th largest magnitude,
    the kept ones carry the inner codec's error (none for ``topk``/``topk+none``).

    Args:
        k: elements to keep (capped at ``numel``); or
        fraction: ``ceil(fraction * numel)`` elements to keep (at least 1 when ``numel > 0``).
        inner: codec of the kept values (default: ``none``, exact).
        device: where ``decompress`` puts its output.
    """

    def __init__(
        self,
        k: int | None = None,
        fraction: float | None = None,
        inner: Codec | None = None,
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__(device)
        if (k is None) == (fraction is None):
            raise ConfigError("codec 'topk': give exactly one of k or fraction")
        if k is not None and (type(k) is not int or k < 1):
            raise ConfigError(f"codec 'topk': k must be a positive int, got {k!r}")
        if fraction is not None and not 0.0 < float(fraction) <= 1.0:
            raise ConfigError(f"codec 'topk': fraction must lie in (0, 1], got {fraction!r}")
        self.k = k
        self.fraction = None if fraction is None else float(fraction)
        self.inner: Codec = inner if inner is not None else NoneCompressor()
        if isinstance(self.inner, TopKCompressor) or self.inner.sends_increments:
            raise ConfigError("codec 'topk': the inner codec must be a plain value codec")
        self.inner.device = self.device
        self.name = "topk" if isinstance(self.inner, NoneCompressor) else f"topk+{self.inner.name}"

    @classmethod
    def composite_names(cls, registry: Any) -> Iterable[str]:
        """``topk+<value codec>`` for every registered value codec but ``none`` (that is ``topk``)."""
        return [f"topk+{v}" for v in registry.value_names() if v != "none"]

    def k_for(self, numel: int) -> int:
        """How many elements a tensor of ``numel`` elements keeps."""
        if numel == 0:
            return 0
        if self.fraction is None:
            return min(int(self.k or 1), numel)
        return min(numel, max(1, math.ceil(self.fraction * numel)))

    def payload_nbytes(self, numel: int, dtype: str = "float32") -> int:
        """``k * index_bytes + inner.payload_nbytes(k)``."""
        k = self.k_for(numel)
        return k * index_dtype(numel).itemsize + self.inner.payload_nbytes(k, dtype)

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        """Select the top-k magnitudes of ``t`` and encode their values with the inner codec."""
        dtype = dtype_name(t, self.name)
        flat = t.detach().reshape(-1)
        n = flat.numel()
        k = self.k_for(n)
        if k:
            idx = torch.topk(flat.abs().float(), k, sorted=False).indices.sort().values
        else:
            idx = torch.zeros(0, dtype=torch.int64, device=flat.device)
        inner = self.inner.compress(flat[idx], key=key)
        idx_bytes = idx.cpu().numpy().astype(index_dtype(n)).tobytes()
        params = (("k", k), *((f"v.{name}", v) for name, v in inner.params))
        return Packet(
            codec=self.name,
            shape=tuple(t.shape),
            dtype=dtype,
            buffers=(idx_bytes, *inner.buffers),
            params=tuple(sorted(params)),
        )

    def decompress(self, p: Packet) -> torch.Tensor:
        """Scatter the decoded values; ``ProtocolError`` on bad indices, sizes or inner packet."""
        if not isinstance(p, Packet) or not isinstance(p.buffers, tuple) or len(p.buffers) < 1:
            raise ProtocolError("topk packet needs an index buffer")
        dtype = check_packet(p, self.name, len(p.buffers))
        n = p.numel
        k = int_param(p, "k", 0, n)
        for name, _ in p.params:
            if name != "k" and not name.startswith("v."):
                raise ProtocolError(f"topk packet has unknown parameter {name!r}")
        idt = index_dtype(n)
        if len(p.buffers[0]) != k * idt.itemsize:
            raise ProtocolError(f"topk indices: expected {k * idt.itemsize} bytes, got {len(p.buffers[0])}")
        idx = torch.from_numpy(np.frombuffer(p.buffers[0], dtype=idt).astype(np.int64))
        if k and (int(idx[-1]) >= n or (k > 1 and not bool((idx[1:] > idx[:-1]).all()))):
            raise ProtocolError("topk indices must be strictly increasing and below numel")
        inner = Packet(
            codec=self.inner.name,
            shape=(k,),
            dtype=p.dtype,
            buffers=p.buffers[1:],
            params=tuple((name[2:], v) for name, v in p.params if name.startswith("v.")),
        )
        values = self.inner.decompress(inner).reshape(-1)
        out = torch.zeros(n, dtype=dtype, device=self.device)
        if k:
            out[idx.to(self.device)] = values.to(device=self.device, dtype=dtype)
        return out.reshape(p.shape)

    def for_error_feedback(self) -> Codec:
        """``self``, or a copy whose value codec is the inner codec's ``for_error_feedback()``: the
        dropped elements are a contraction already, the kept ones must not add more error than they
        carry."""
        inner = self.inner.for_error_feedback()
        if inner is self.inner:
            return self
        if self.k is not None:
            return TopKCompressor(k=self.k, inner=inner, device=self.device)
        return TopKCompressor(fraction=self.fraction, inner=inner, device=self.device)

    def __repr__(self) -> str:
        how = f"k={self.k}" if self.k is not None else f"fraction={self.fraction}"
        return f"TopKCompressor({how}, inner={self.inner!r})"
