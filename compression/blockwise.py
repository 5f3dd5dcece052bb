"""Blockwise absmax quantisation to 8 and 4 bits (``int8``, ``int4``).

The flat tensor is cut into blocks of ``block`` elements (the last block may be shorter). Each block
stores one float32 scale ``s = absmax * (1 / qmax)`` and integer codes ``q = round(x * (qmax /
absmax))`` in ``[-qmax, qmax]``; decoding is ``q * s``. This is the linear blockwise scheme of
Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (2022), with a linear code instead
of their dynamic one so that decoding is one IEEE multiply, bit-identical on every device.

Compiled (``compression.kernels``) and eager paths share the kernels below and give identical bytes;
float32 CPU tensors are encoded by the C kernel of ``compression.native``, which gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from compression import staging
from compression.base import CODECS, check_absmax_top, check_finite_absmax, dtype_name, tensor_bytes
from compression.blocks import MAX_BLOCK, MIN_BLOCK, BlockScaledCodec, Decoder, check_block, kernel
from compression.native import encode_blockwise
from swarmtrain.core.packet import Packet

__all__ = ["BlockwiseCodec", "Int8Compressor", "Int4Compressor", "MIN_BLOCK", "MAX_BLOCK", "tiny_rescale"]

Encoder = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


# Blocks whose absmax is below 2**-64 are scaled up by 2**64 (exact) before quantising: otherwise
# ``qmax / absmax`` overflows to inf for absmax below ~1e-37, and every code becomes +-qmax (or the
# int cast of NaN for zeros). Every other block multiplies by 1.0, which changes no bit.
_TINY = 2.0**-64
_UP = 2.0**64


def tiny_rescale(am: torch.Tensor) -> torch.Tensor:
    """Per-block factor: ``2**64`` where the block absmax is below ``2**-64``, else 1 (both exact)."""
    return torch.where(am < _TINY, _UP, 1.0)


def _grid(xb: torch.Tensor, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Round blocks ``xb [nb, block]`` to the integer grid ``-qmax..qmax`` of their absmax.

    Returns:
        ``(codes as float [nb, block], absmax [nb, 1])``; all-zero blocks give zero codes.
    """
    am = xb.abs().amax(1, keepdim=True)  # [nb, 1]
    up = tiny_rescale(am)  # [nb, 1]
    ams = am * up
    inv = torch.where(ams > 0, qmax / ams, torch.zeros_like(ams))
    return torch.round((xb * up) * inv).clamp(-qmax, qmax), am


def _int8_encoder(block: int) -> Encoder:
    def enc(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, am = _grid(x.reshape(-1, block).float(), 127.0)  # [nb, block], [nb, 1]
        return q.to(torch.int8).reshape(-1), am.reshape(-1)

    return enc


def _int4_encoder(block: int) -> Encoder:
    def enc(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, am = _grid(x.reshape(-1, block).float(), 7.0)  # [nb, block], block even
        code = (q + 8.0).to(torch.uint8)  # [nb, block], 1..15
        half = block // 2  # element j sits in byte j's low nibble, element j + half in its high one
        return (code[:, :half] | (code[:, half:] << 4)).reshape(-1), am.reshape(-1)

    return enc


def _int8_decoder(block: int, dtype: torch.dtype) -> Decoder:
    def dec(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return (q.reshape(-1, block).float() * s.reshape(-1, 1)).to(dtype).reshape(-1)

    return dec


def _int4_decoder(block: int, dtype: torch.dtype) -> Decoder:
    def dec(packed: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        # int32 lanes and a broadcast shift vectorise far better than two slices and a cat
        pb = packed.reshape(-1, 1, block // 2).to(torch.int32)  # [nb, 1, block / 2]
        shifts = torch.tensor([0, 4], device=packed.device, dtype=torch.int32).view(1, 2, 1)
        q = (((pb >> shifts) & 15) - 8).clamp(min=-7).reshape(-1, block)  # [nb, block]
        return (q.float() * s.reshape(-1, 1)).to(dtype).reshape(-1)

    return dec


def _scales(am: torch.Tensor, qmax: int) -> torch.Tensor:
    """``am * float32(1 / qmax)`` per block; on CPU with numpy on this thread (a small array)."""
    if am.device.type == "cpu":
        return torch.from_numpy(am.contiguous().numpy() * np.float32(1.0 / qmax))
    return am * (1.0 / qmax)


class BlockwiseCodec(BlockScaledCodec):
    """Blockwise absmax quantiser with ``bits`` bits per code; subclasses fix ``bits``.

    Args:
        block: elements per block (a multiple of 8, at most 2**20). Smaller blocks bound the error
            more tightly at the cost of one float32 scale (4 bytes) per block.
        device: where ``decompress`` puts its output (``compress`` works on the input's device).
    """

    bits = 8
    qmax = 127
    code_dtype = torch.int8  # int4's nibbles are unsigned bytes
    value_codec = True

    def __init__(self, block: int = 256, device: str | torch.device | None = None) -> None:
        super().__init__(device)
        self.block = check_block(block, self.name)

    def _encoder(self, block: int) -> Encoder:  # pragma: no cover - abstract
        raise NotImplementedError

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        """Quantise ``t`` blockwise (see the class docstring for the error bound)."""
        dtype = dtype_name(t, self.name)
        x = t.detach().reshape(-1)
        if x.is_cuda:  # quantised on the device, copied through a pinned buffer (same bytes)
            return staging.compress_packet(self, t, key)
        fast = encode_blockwise(x, self.block, self.bits)
        if fast is not None:  # one fused pass straight into the packet's bytes (same bytes)
            codes_b, scales_b, top = fast
            check_absmax_top(top, dtype, self.name)
            return self._packet(t, dtype, codes_b, scales_b)
        codes, am = self._encode(x)
        check_finite_absmax(am, dtype, self.name)
        scales = _scales(am.float(), self.qmax)
        return self._packet(t, dtype, tensor_bytes(*codes), tensor_bytes(scales))

    def device_parts(self, t: torch.Tensor, *, key: str = "") -> staging.DeviceParts:
        """The packet's payload as tensors on ``t``'s device, with no host synchronisation.

        Same kernels as ``compress``'s generic path; the finite check is left to the caller
        (``compression.staging`` runs it on ``top`` once the payload is on the host).
        """
        dtype = dtype_name(t, self.name)
        codes, am = self._encode(t.detach().reshape(-1))
        scales = _scales(am.float(), self.qmax)
        top = torch.amax(am.float()) if am.numel() else None  # amax propagates NaN
        return staging.DeviceParts(
            self.name, tuple(t.shape), dtype, (("block", self.block),), (tuple(codes), (scales,)), top
        )

    def _encode(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Codes (one or two pieces) and per-block absmax of the flat ``x``, on its device."""
        n = x.numel()
        full = n - n % self.block
        codes, absmax = [], []
        if full:
            kern = kernel(f"{self.name}-enc", self.block, self._encoder)
            # A [nblocks, block] view: with a flat input Inductor's dynamic-shape loops for the
            # absmax and the quantisation get different bounds and are not fused into one pass.
            c, a = kern(x[:full].view(-1, self.block), numel=full)
            codes.append(c)
            absmax.append(a)
        if n > full:
            tail = x[full:]
            unit = 8 // self.bits  # pad the short last block with zeros to whole code bytes
            width = tail.numel() + (-tail.numel()) % unit
            padded = torch.zeros(width, dtype=x.dtype, device=x.device)
            padded[: tail.numel()] = tail
            c, a = self._encoder(width)(padded)
            codes.append(c[: self._codes_nbytes(tail.numel())])
            absmax.append(a)
        am = torch.cat(absmax) if len(absmax) > 1 else (absmax[0] if absmax else torch.zeros(0))
        return codes, am

    def __repr__(self) -> str:
        return f"{type(self).__name__}(block={self.block})"


@CODECS.register("int8")
class Int8Compressor(BlockwiseCodec):
    """8-bit blockwise absmax quantisation: ``1 + 4 / block`` bytes per element.

    Error bound: every decoded element is within ``absmax / 254`` of the input, where ``absmax`` is
    the largest magnitude in its block (plus float32 rounding, a few ulp of ``absmax``). Inputs with
    non-finite values raise ``UpdateRejected``.
    """

    name = "int8"
    bits = 8
    qmax = 127

    def _encoder(self, block: int) -> Encoder:
        return _int8_encoder(block)

    def _decoder(self, block: int, dtype: torch.dtype) -> Decoder:
        return _int8_decoder(block, dtype)


@CODECS.register("int4")
class Int4Compressor(BlockwiseCodec):
    """4-bit blockwise absmax quantisation, two codes per byte: ``0.5 + 4 / block`` bytes per element.

    Codes ``q`` in ``[-7, 7]`` are stored as nibbles ``q + 8``: within a block of ``B`` elements (the
    last block padded with a zero to even length), byte ``j`` holds element ``j`` in its low nibble
    and element ``j + B / 2`` in its high nibble. The
    decoder reads nibble 0 (never written by an honest encoder) as ``-7``. Error bound: within
    ``absmax / 14`` of the input per element (plus float32 rounding).
    """

    name = "int4"
    bits = 4
    qmax = 7
    code_dtype = torch.uint8

    def _encoder(self, block: int) -> Encoder:
        return _int4_encoder(block)

    def _decoder(self, block: int, dtype: torch.dtype) -> Decoder:
        return _int4_decoder(block, dtype)
