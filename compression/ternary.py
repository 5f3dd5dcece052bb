"""TernGrad: unbiased stochastic ternarisation (Wen et al., "TernGrad: Ternary Gradients to Reduce
Communication in Distributed Deep Learning", NeurIPS 2017), with one scale per block.

Each block of ``block`` elements keeps its absmax ``s`` (float32) and sends, per element, a code in
``{-1, 0, +1}``: ``sign(x) * Bernoulli(|x| / s)``; decoding gives ``s * code``, so the expectation is
``x``. Codes take 2 bits (``0`` -> 0, ``1`` -> +1, ``2`` -> -1; the decoder reads the unused ``3``
as 0), four per byte: within a block of ``B`` elements (the last block padded with zeros to a
multiple of 4), byte ``j`` holds element ``j + i * B / 4`` in bits ``2i..2i+1``.

Randomness. The uniform draws come from a counter-based hash of (seed, key, call number, element
index) computed with exact integer arithmetic, not from a ``torch.Generator``: the same inputs give
the same packet on CPU and GPU and on the eager, compiled and native (``compression.native``) paths,
and a run is reproducible from ``seed``. Each draw has 24 bits and sits at the middle of its cell
(``(k + 0.5) / 2**24``); an element is kept when ``u * s < |x|`` (one float32 multiply, with blocks
whose absmax is below ``2**-64`` first scaled by ``2**64``, exactly), so the rounding probability
differs from ``|x| / s`` by at most about ``2**-24`` and values below about ``2**-25 * s`` always
round to 0.

Inside error feedback. TernGrad is unbiased but not a contraction: per block, the expected squared
error is ``w ||x||^2`` with ``w = s sum|x| / sum x^2 - 1`` (about 1.4 for Gaussian blocks of 256), so an
error-feedback residual around it grows to several times its input. ``for_error_feedback()`` returns a
copy with ``contractive=True`` that sends each block's scale as ``sum x^2 / sum |x| = s / (1 + w)``
instead of ``s`` (same codes): the least-squares scale of the draws, which cuts the expected error to
``w / (1 + w) < 1`` of the block's norm (Beznosikov et al. 2020, "On Biased Compression for Distributed
Learning", show that ``C / (1 + w)`` of an unbiased ``C`` of variance ``w`` is a contraction). The
packet is an ordinary ternary packet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import torch

from compression import staging
from compression.base import CODECS, check_absmax_top, check_finite_absmax, dtype_name, tensor_bytes
from compression.blocks import BlockScaledCodec, Decoder, check_block, kernel
from compression.blockwise import tiny_rescale
from compression.native import encode_ternary
from swarmtrain.core.packet import Packet
from swarmtrain.core.protocols import StatefulCompressor

__all__ = ["TernaryCompressor", "hash_uniform"]

_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B  # < 2**27, so the products below stay far from int64 overflow


def hash_uniform(idx: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Uniform float32 draws in ``(0, 1)`` from int64 element indices and an int64 ``base``.

    A 32-bit integer mixer (two multiply-xorshift rounds) of ``(idx + base) mod 2**32``; its top 24
    bits give ``(k + 0.5) / 2**24``. Pure integer ops, so every device and compiler agrees.
    """
    h = (idx + base) & _M32
    h = (((h >> 16) ^ h) * _MUL) & _M32
    h = (((h >> 16) ^ h) * _MUL) & _M32
    h = (h >> 16) ^ h
    return ((h >> 8).float() + 0.5) * (2.0**-24)


def _hash_uniform32(idx: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """``hash_uniform`` on int32 lanes: the same draws, at half the vector width of int64.

    int32 tensors hold the bit patterns of the uint32 values: additions and products wrap modulo
    2**32 (what the CPU and GPU integer units do), and a mask after each arithmetic right shift
    makes it the logical shift of the uint32 mixer. The tests check it against ``hash_uniform``.
    """
    h = idx + base
    h = ((h >> 16) & 0xFFFF) ^ h
    h = h * _MUL
    h = ((h >> 16) & 0xFFFF) ^ h
    h = h * _MUL
    h = ((h >> 16) & 0xFFFF) ^ h
    return (((h >> 8) & 0xFFFFFF).float() + 0.5) * (2.0**-24)


def _as_int32(v: int) -> int:
    """The int32 whose bit pattern is ``v mod 2**32``."""
    v &= _M32
    return v - (1 << 32) if v >= 1 << 31 else v


def _encoder(block: int) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    def enc(x: torch.Tensor, base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # base: int32 (the bit pattern of base mod 2**32) when x has < 2**31 elements, else int64
        xb = x.reshape(-1, block).float()  # [nb, block], block % 4 == 0
        am = xb.abs().amax(1, keepdim=True)  # [nb, 1]
        s = torch.where(am > 0, am, torch.ones_like(am))
        up = tiny_rescale(am)  # exact power-of-2 rescale of tiny blocks
        idx = torch.arange(xb.numel(), device=x.device, dtype=base.dtype).reshape(xb.shape)
        u = _hash_uniform32(idx, base) if base.dtype == torch.int32 else hash_uniform(idx, base)
        # keep with probability |x| / s, as u * s < |x|: a multiply, not a division (a division per
        # element dominates the encoder's cost); the rescale keeps u * s out of subnormals
        keep = u * (s * up) < xb.abs() * up
        # codes 0, 1 (+1) or 2 (-1), in int32 lanes like the floats (8-bit lanes vectorise badly)
        code = keep.to(torch.int32) + (keep & (xb < 0)).to(torch.int32)
        w = block // 4  # byte j of a block holds elements j + i * w in bits 2i..2i+1 (i = 0..3)
        packed = code[:, :w] | (code[:, w : 2 * w] << 2)
        packed = packed | (code[:, 2 * w : 3 * w] << 4) | (code[:, 3 * w :] << 6)
        return packed.to(torch.uint8).reshape(-1), am.reshape(-1)

    return enc


def _base_tensor(base: int, numel: int, device: torch.device) -> torch.Tensor:
    """``base`` as the encoder takes it: int32 lanes unless the element indices need int64."""
    if numel < 1 << 31:
        return torch.full((), _as_int32(base), dtype=torch.int32, device=device)
    return torch.full((), base, dtype=torch.int64, device=device)


def _decoder(block: int, dtype: torch.dtype) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def dec(packed: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        # int32 lanes and a broadcast shift vectorise far better than per-plane slices and a cat
        pb = packed.reshape(-1, 1, block // 4).to(torch.int32)  # [nb, 1, block / 4]
        shifts = torch.arange(0, 8, 2, device=packed.device, dtype=torch.int32).view(1, 4, 1)
        c = (pb >> shifts) & 3  # [nb, 4, block / 4]
        v = ((c == 1).float() - (c == 2).float()).reshape(-1, block)  # code 3 reads as 0
        return (v * s.reshape(-1, 1)).to(dtype).reshape(-1)

    return dec


def _contractive_scales(x: torch.Tensor, block: int) -> torch.Tensor:
    """Per-block ``sum x^2 / sum |x|`` (0 for all-zero blocks) as float32, on ``x``'s device.

    Computed in float64 so squares of tiny float32 values do not underflow; the result is at most the
    block's absmax, so it passes every decoder's scale check.
    """
    n = x.numel()
    nb = -(-n // block)
    xf = x.detach().reshape(-1).to(torch.float64)
    if nb * block != n:
        xf = torch.cat([xf, xf.new_zeros(nb * block - n)])
    xb = xf.view(nb, block)  # [nb, block]
    l1 = xb.abs().sum(1)
    l2 = (xb * xb).sum(1)
    s = torch.where(l1 > 0, l2 / l1.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(l1))
    return s.float()


@CODECS.register("ternary")
class TernaryCompressor(BlockScaledCodec, StatefulCompressor):
    """TernGrad ternarisation: ``0.25 + 4 / block`` bytes per element, unbiased.

    Error bound: each decoded element is ``0`` or ``sign(x) * absmax`` of its block, so it is within
    ``absmax`` of the input; ``E[decode(compress(x))] = x`` up to about ``2**-24 * absmax`` per element.
    The variance of an element is ``|x| * (absmax - |x|)``.

    Args:
        block: elements per block (multiple of 8, at most 2**20).
        seed: seeds the draws; with the per-key call counter (kept in ``state_dict``) it fixes every
            packet of a run.
        device: where ``decompress`` puts its output.
        contractive: send each block's scale as ``sum x^2 / sum |x|`` (biased, a contraction: what
            error feedback needs; see the module docstring) instead of its absmax (unbiased).
    """

    name = "ternary"
    bits = 2
    qmax = 1  # a decoded element is at most its block's scale
    value_codec = True

    def __init__(
        self,
        block: int = 256,
        seed: int = 0,
        device: str | torch.device | None = None,
        *,
        contractive: bool = False,
    ) -> None:
        super().__init__(device)
        self.contractive = bool(contractive)
        self.block = check_block(block, self.name)
        self.seed = int(seed)
        self._calls: dict[str, int] = {}

    def _base(self, key: str) -> int:
        n = self._calls.get(key, 0)
        self._calls[key] = n + 1
        digest = hashlib.blake2b(f"{self.seed}\0{key}\0{n}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "little")

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        """Ternarise ``t`` with fresh draws (the ``key``'s call counter advances)."""
        dtype = dtype_name(t, self.name)
        x = t.detach().reshape(-1)
        if x.is_cuda:  # ternarised on the device, copied through a pinned buffer (same bytes)
            return staging.compress_packet(self, t, key)
        base = self._base(key)
        fast = encode_ternary(x, self.block, base)
        if fast is not None:  # one fused pass straight into the packet's bytes (same bytes)
            codes_b, scales_b, top = fast
            check_absmax_top(top, dtype, self.name)
            if self.contractive:
                scales_b = tensor_bytes(_contractive_scales(x, self.block))
            return self._packet(t, dtype, codes_b, scales_b)
        codes, am = self._encode(x, base)
        check_finite_absmax(am, dtype, self.name)
        scales = _contractive_scales(x, self.block) if self.contractive else am.float()
        return self._packet(t, dtype, tensor_bytes(*codes), tensor_bytes(scales))

    def device_parts(self, t: torch.Tensor, *, key: str = "") -> staging.DeviceParts:
        """The packet's payload as tensors on ``t``'s device, with no host synchronisation (the
        ``key``'s call counter advances; the finite check is ``compression.staging``'s, on ``top``)."""
        dtype = dtype_name(t, self.name)
        x = t.detach().reshape(-1)
        codes, am = self._encode(x, self._base(key))
        scales = _contractive_scales(x, self.block) if self.contractive else am.float()
        top = torch.amax(am.float()) if am.numel() else None  # amax propagates NaN
        return staging.DeviceParts(
            self.name, tuple(t.shape), dtype, (("block", self.block),), (tuple(codes), (scales,)), top
        )

    def _encode(self, x: torch.Tensor, base: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Packed codes (one or two pieces) and per-block absmax of the flat ``x``, on its device."""
        n = x.numel()
        full = n - n % self.block
        codes, absmax = [], []
        if full:
            b = _base_tensor(base, full, x.device)
            xb = x[:full].view(-1, self.block)  # 2D so Inductor fuses absmax and packing in one pass
            c, a = kernel("ternary-enc", self.block, _encoder)(xb, b, numel=full)
            codes.append(c)
            absmax.append(a)
        if n > full:
            tail = x[full:]
            width = tail.numel() + (-tail.numel()) % 4
            padded = torch.zeros(width, dtype=x.dtype, device=x.device)
            padded[: tail.numel()] = tail
            c, a = _encoder(width)(padded, _base_tensor(base + full, width, x.device))
            codes.append(c[: (tail.numel() + 3) // 4])
            absmax.append(a)
        am = torch.cat(absmax) if len(absmax) > 1 else (absmax[0] if absmax else torch.zeros(0))
        return codes, am

    def for_error_feedback(self) -> TernaryCompressor:
        """A ``contractive`` copy (same block, seed, device and call counters); ``self`` if it is one."""
        if self.contractive:
            return self
        twin = TernaryCompressor(self.block, self.seed, self.device, contractive=True)
        twin._calls = dict(self._calls)
        return twin

    def _decoder(self, block: int, dtype: torch.dtype) -> Decoder:
        return _decoder(block, dtype)

    def state_dict(self) -> dict[str, Any]:
        """The seed and per-key call counters (restoring them reproduces the next packets)."""
        return {"seed": self.seed, "calls": dict(self._calls)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()`` output."""
        self.seed = int(state["seed"])
        self._calls = {str(k): int(v) for k, v in dict(state["calls"]).items()}

    def __repr__(self) -> str:
        extra = ", contractive=True" if self.contractive else ""
        return f"TernaryCompressor(block={self.block}, seed={self.seed}{extra})"
