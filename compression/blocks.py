"""Block-scaled codes: the packet layout shared by the blockwise integer codecs (``compression.blockwise``)
and TernGrad (``compression.ternary``).

A packet holds two buffers: the codes, ``bits`` bits each packed into bytes (the last block padded
with zero codes to whole bytes), then one float32 scale per block of ``block`` elements (the packet's
only parameter). This module owns that layout: the block's bounds, building the packet, and decoding
it (checks, whole blocks through one compiled kernel, the short last block eagerly). A codec of this
family says how a block is encoded and how its codes decode (``_decoder``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from compression import staging
from compression.base import Codec, buffer_tensor, check_packet, check_scales, int_param
from compression.kernels import Kernel
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.packet import Packet

__all__ = ["BlockScaledCodec", "Decoder", "MAX_BLOCK", "MIN_BLOCK", "check_block", "kernel"]

MIN_BLOCK = 8
MAX_BLOCK = 1 << 20

Decoder = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_KERNELS: dict[tuple[str, int], Kernel] = {}


def kernel(kind: str, block: int, make: Callable[[int], Callable[..., Any]]) -> Kernel:
    """The compiled kernel ``make(block)``, built once per ``(kind, block)``."""
    k = _KERNELS.get((kind, block))
    if k is None:
        k = _KERNELS[(kind, block)] = Kernel(make(block), f"{kind}[block={block}]")
    return k


def check_block(block: object, codec: str) -> int:
    """``block`` if it is a multiple of 8 in ``[MIN_BLOCK, MAX_BLOCK]``, else ``ConfigError``."""
    if type(block) is not int or block % 8 or not MIN_BLOCK <= block <= MAX_BLOCK:
        raise ConfigError(f"codec {codec!r}: block must be a multiple of 8 in [8, 2**20], not {block}")
    return block


class BlockScaledCodec(Codec):
    """A codec whose packets are ``bits``-bit codes plus one float32 scale per ``block`` elements.

    Subclasses set ``bits`` (8, 4 or 2), ``qmax`` (the largest code magnitude: a scale times ``qmax``
    must stay finite in the packet's dtype) and ``block`` in ``__init__``, and give ``_decoder``.
    """

    bits: ClassVar[int]
    qmax: ClassVar[int]
    code_dtype: ClassVar[torch.dtype] = torch.uint8
    block: int

    def _codes_nbytes(self, numel: int) -> int:
        return (numel * self.bits + 7) // 8

    def payload_nbytes(self, numel: int, dtype: str = "float32") -> int:
        """``ceil(numel * bits / 8)`` code bytes plus 4 bytes per block."""
        return self._codes_nbytes(numel) + 4 * (-(-numel // self.block))

    def _decoder(self, block: int, dtype: torch.dtype) -> Decoder:
        """Codes of whole blocks of ``block`` elements and their scales -> the decoded ``dtype`` values."""
        raise NotImplementedError  # pragma: no cover - abstract

    def _packet(self, t: torch.Tensor, dtype: str, codes: bytes, scales: bytes) -> Packet:
        return Packet(
            codec=self.name,
            shape=tuple(t.shape),
            dtype=dtype,
            buffers=(codes, scales),
            params=(("block", self.block),),
        )

    def decompress(self, p: Packet) -> torch.Tensor:
        """Decode ``p``; ``ProtocolError`` if it is inconsistent (lengths, block, scales)."""
        dtype = check_packet(p, self.name, 2)
        block = int_param(p, "block", MIN_BLOCK, MAX_BLOCK)
        if block % 8:
            raise ProtocolError(f"codec {self.name!r}: block {block} is not a multiple of 8")
        n = p.numel
        codes = buffer_tensor(p.buffers[0], self.code_dtype, self._codes_nbytes(n), f"{self.name} codes")
        scales = buffer_tensor(p.buffers[1], torch.float32, -(-n // block), f"{self.name} scales")
        check_scales(scales, p.dtype, self.qmax, self.name)
        codes = staging.to_device(codes, self.device)  # through a pinned buffer to a GPU
        scales = staging.to_device(scales, self.device)
        return self._out(self._decode(p.dtype, dtype, block, n, codes, scales), p)

    def _decode(
        self,
        dtype_name: str,
        dtype: torch.dtype,
        block: int,
        n: int,
        codes: torch.Tensor,
        scales: torch.Tensor,
    ) -> torch.Tensor:
        """The ``n`` flat values: whole blocks through the compiled kernel, the short tail eagerly."""
        full = n - n % block
        nfb = full // block
        parts = []
        if full:
            kern = kernel(f"{self.name}-dec-{dtype_name}", block, lambda b: self._decoder(b, dtype))
            per_block = self._codes_nbytes(block)  # 2D views: one loop bound shared by both inputs
            q2 = codes[: self._codes_nbytes(full)].view(nfb, per_block)
            parts.append(kern(q2, scales[:nfb].view(nfb, 1), numel=full))
        if n > full:
            width = (n - full) + (-(n - full)) % (8 // self.bits)
            tail = codes[self._codes_nbytes(full) :]
            pad = self._codes_nbytes(width) - tail.numel()
            if pad:
                tail = torch.cat([tail, tail.new_zeros(pad)])
            parts.append(self._decoder(width, dtype)(tail, scales[nfb:])[: n - full])
        return torch.cat(parts) if len(parts) > 1 else (parts[0] if parts else torch.zeros(0, dtype=dtype))
