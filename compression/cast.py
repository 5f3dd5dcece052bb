"""Lossless and cast codecs: ``none`` (raw bytes), ``fp16`` and ``bf16`` (round to nearest even).

These are the baselines every lossy codec is compared against: ``none`` costs the tensor's own
bytes, ``fp16``/``bf16`` two bytes per element.
"""

from __future__ import annotations

import torch

from compression.base import CODECS, Codec, buffer_tensor, check_packet, dtype_name, tensor_bytes
from swarmtrain.core.errors import UpdateRejected
from swarmtrain.core.packet import Packet

__all__ = ["NoneCompressor", "FP16Compressor", "BF16Compressor"]


@CODECS.register("none")
class NoneCompressor(Codec):
    """No compression: the tensor's bytes in its own dtype (4 bytes per float32 element, 2 for 16-bit).

    Error bound: none, decoding returns the input bit for bit (NaN and inf included).
    """

    name = "none"
    value_codec = True

    def payload_nbytes(self, numel: int, dtype: str = "float32") -> int:
        """``numel * itemsize(dtype)``."""
        return numel * (4 if dtype == "float32" else 2)

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        """Copy ``t``'s bytes into a packet."""
        dtype = dtype_name(t, self.name)
        return Packet(codec=self.name, shape=tuple(t.shape), dtype=dtype, buffers=(tensor_bytes(t),))

    def decompress(self, p: Packet) -> torch.Tensor:
        """A fresh tensor with the packet's bytes; ``ProtocolError`` if the length is wrong."""
        dtype = check_packet(p, self.name, 1)
        flat = buffer_tensor(p.buffers[0], dtype, p.numel, "none payload").clone()
        return self._out(flat, p)


class _CastCodec(Codec):
    """Round to a 16-bit float type and back; values beyond its range raise ``UpdateRejected``."""

    wire_dtype: torch.dtype = torch.float16
    value_codec = True

    def payload_nbytes(self, numel: int, dtype: str = "float32") -> int:
        """Two bytes per element."""
        return 2 * numel

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        """Round ``t`` to the wire dtype (round to nearest even)."""
        dtype = dtype_name(t, self.name)
        x = t.detach()
        if x.numel():
            lo, hi = torch.aminmax(x)  # one read pass; NaN propagates and fails the check below
            limit = torch.finfo(self.wire_dtype).max
            if not (-limit <= float(lo) and float(hi) <= limit):
                raise UpdateRejected(f"codec {self.name!r}: values not finite in {self.wire_dtype}")
        h = x.to(self.wire_dtype)
        return Packet(codec=self.name, shape=tuple(t.shape), dtype=dtype, buffers=(tensor_bytes(h),))

    def decompress(self, p: Packet) -> torch.Tensor:
        """Widen the payload to the packet dtype; ``ProtocolError`` if the length is wrong."""
        dtype = check_packet(p, self.name, 1)
        flat = buffer_tensor(p.buffers[0], self.wire_dtype, p.numel, f"{self.name} payload")
        flat = flat.to(self.device).to(dtype, copy=True)
        return self._out(flat, p)


@CODECS.register("fp16")
class FP16Compressor(_CastCodec):
    """IEEE half precision. Error bound: relative ``2**-11`` per element for normal fp16 values
    (|x| >= 2**-14), absolute ``2**-25`` below; |x| > 65504 raises ``UpdateRejected``."""

    name = "fp16"
    wire_dtype = torch.float16


@CODECS.register("bf16")
class BF16Compressor(_CastCodec):
    """bfloat16 (float32's range, 8 significant bits). Error bound: relative ``2**-8`` per element."""

    name = "bf16"
    wire_dtype = torch.bfloat16
