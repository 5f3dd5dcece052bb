"""Shared machinery of the tensor codecs: the registry, dtype rules, packet checks and byte helpers.

Every codec turns a float tensor into a ``swarmtrain.core.packet.Packet`` (plain bytes plus a few small
parameters) and back. Decoding treats the packet as hostile: it comes from a peer, so each check
below raises ``ProtocolError`` naming what was wrong instead of crashing or allocating without bound.
All multi-byte buffers are little-endian.
"""

from __future__ import annotations

import warnings
from typing import ClassVar

import numpy as np
import torch

from swarmtrain.core.errors import ConfigError, ProtocolError, UpdateRejected
from swarmtrain.core.packet import Packet, ParamValue
from swarmtrain.core.registry import CODECS

__all__ = [
    "CODECS",
    "DTYPES",
    "Codec",
    "dtype_name",
    "check_packet",
    "int_param",
    "buffer_tensor",
    "tensor_bytes",
    "check_scales",
    "check_finite_absmax",
    "check_absmax_top",
    "abs_limit",
]

# ``CODECS`` (re-exported here) is ``swarmtrain.core.registry.CODECS``: the wire's allow-list derives
# from it. Codecs register with ``@CODECS.register(name)``; plugins through ``compression.plugins``.

#: dtypes a packet may declare (the wire allow-list uses the same names).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_NAMES = {v: k for k, v in DTYPES.items()}

# Largest magnitude a scaled codec accepts for float32/bfloat16 data; far above any gradient or weight,
# and low enough that ``code * scale`` can never overflow float32 on decode.
_ABS_LIMIT_WIDE = 2.0**100


def dtype_name(t: torch.Tensor, codec: str) -> str:
    """The packet dtype name of ``t``; ``ConfigError`` for dtypes no codec carries (ints, float64)."""
    name = _NAMES.get(t.dtype)
    if name is None:
        raise ConfigError(f"codec {codec!r} compresses float32/float16/bfloat16 tensors, got {t.dtype}")
    return name


def abs_limit(dtype: str) -> float:
    """Largest |value| a scaled codec encodes for ``dtype`` (float16: its max, else 2**100)."""
    return 65504.0 if dtype == "float16" else _ABS_LIMIT_WIDE


def check_packet(p: Packet, codec: str, n_buffers: int) -> torch.dtype:
    """Check the fields every codec relies on and return the decoded dtype.

    Raises:
        ProtocolError: wrong codec name, dtype outside the allow-list, wrong buffer count, bad shape.
    """
    if not isinstance(p, Packet):
        raise ProtocolError(f"expected a Packet, got {type(p).__name__}")
    if p.codec != codec:
        raise ProtocolError(f"packet codec {p.codec!r} sent to the {codec!r} decoder")
    dtype = DTYPES.get(p.dtype)
    if dtype is None:
        raise ProtocolError(f"packet dtype {p.dtype!r} is not one of {sorted(DTYPES)}")
    if not isinstance(p.buffers, tuple) or len(p.buffers) != n_buffers:
        raise ProtocolError(f"codec {codec!r} expects {n_buffers} buffers, packet has {len(p.buffers)}")
    if any(not isinstance(b, bytes) for b in p.buffers):
        raise ProtocolError("packet buffers must be bytes")
    if not isinstance(p.shape, tuple) or any(type(s) is not int or s < 0 for s in p.shape):
        raise ProtocolError(f"packet shape {p.shape!r} is not a tuple of non-negative ints")
    return dtype


def int_param(p: Packet, key: str, lo: int, hi: int) -> int:
    """The integer parameter ``key`` of ``p``, checked to lie in ``[lo, hi]``.

    Raises:
        ProtocolError: missing, not an int (bools are not ints here), or out of range.
    """
    try:
        v: ParamValue = p.param(key)
    except KeyError:
        raise ProtocolError(f"codec {p.codec!r} packet lacks parameter {key!r}") from None
    if type(v) is not int or not lo <= v <= hi:
        raise ProtocolError(f"codec {p.codec!r} parameter {key}={v!r} outside [{lo}, {hi}]")
    return v


def buffer_tensor(buf: bytes, dtype: torch.dtype, count: int, what: str) -> torch.Tensor:
    """A read-only CPU tensor view of ``buf`` holding exactly ``count`` elements of ``dtype``.

    Raises:
        ProtocolError: ``len(buf)`` is not ``count`` elements.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(buf) != count * itemsize:
        raise ProtocolError(f"{what}: expected {count * itemsize} bytes, got {len(buf)}")
    if count == 0:
        return torch.empty(0, dtype=dtype)
    with warnings.catch_warnings():
        # The view never gets written: decoders only read it into fresh tensors.
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=dtype, count=count)


def tensor_bytes(*parts: torch.Tensor) -> bytes:
    """Concatenate the raw little-endian bytes of ``parts`` (moved to CPU) in one copy."""
    views = []
    for t in parts:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.numel() == 0:
            continue
        views.append(np.asarray(t.contiguous().reshape(-1).view(torch.uint8).numpy()))
    if len(views) == 1:
        return views[0].tobytes()
    return b"".join(v.data for v in views)


def _extremes(t: torch.Tensor) -> tuple[float, float]:
    """``(min, max)`` of a non-empty float tensor; NaN in either when ``t`` holds a NaN.

    Per-block scales are small (one per block): on CPU numpy reduces them on the calling thread,
    because waking torch's thread pool for a few hundred KB costs milliseconds on a busy machine.
    """
    if t.device.type == "cpu":
        a = t.detach().contiguous().numpy()
        return float(a.min()), float(a.max())  # numpy's min/max propagate NaN
    lo_t, hi_t = torch.aminmax(t)  # NaN propagates into both
    return float(lo_t), float(hi_t)


def check_scales(scales: torch.Tensor, dtype: str, qmax: int, codec: str) -> None:
    """Reject per-block scales from a peer that are negative, non-finite or could overflow ``dtype``."""
    if scales.numel() == 0:
        return
    limit = float(torch.tensor(abs_limit(dtype), dtype=torch.float32) / qmax)
    lo, hi = _extremes(scales)
    if not (lo >= 0.0 and hi <= limit):  # also false for NaN
        raise ProtocolError(f"codec {codec!r}: block scales must lie in [0, {limit:.3g}], got {lo}..{hi}")


def check_finite_absmax(absmax: torch.Tensor, dtype: str, codec: str) -> None:
    """Refuse to encode blocks whose absmax is non-finite or beyond ``abs_limit(dtype)``."""
    if absmax.numel() == 0:
        return
    check_absmax_top(_extremes(absmax)[1], dtype, codec)


def check_absmax_top(top: float, dtype: str, codec: str) -> None:
    """``check_finite_absmax`` given the largest block absmax ``top`` (NaN if any input was NaN)."""
    if not top <= abs_limit(dtype):  # NaN compares false
        raise UpdateRejected(f"codec {codec!r} cannot encode non-finite or huge values (max |x| = {top})")


class Codec:
    """Base class of the registered codecs (implements the ``swarmtrain.core.protocols.Compressor`` protocol).

    Subclasses set ``name``, implement ``compress``/``decompress`` and ``payload_nbytes`` (the exact
    payload size for ``numel`` elements, which the tests check against real packets).
    """

    name: str = ""
    #: True for codecs whose decode of a packet is not an estimate of the input itself.
    sends_increments: ClassVar[bool] = False
    #: True for codecs that may carry top-k's kept values (``topk+<name>``): any 1-D float tensor.
    value_codec: ClassVar[bool] = False

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:  # pragma: no cover - abstract
        raise NotImplementedError

    def decompress(self, p: Packet) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def payload_nbytes(self, numel: int, dtype: str = "float32") -> int:  # pragma: no cover - abstract
        """Exact payload bytes of a packet of ``numel`` elements of ``dtype``."""
        raise NotImplementedError

    def for_error_feedback(self) -> Codec:
        """The codec error feedback wraps in place of this one: a contraction.

        Error feedback needs ``E||C(x) - x||^2 <= (1 - d) ||x||^2`` for some ``d > 0``; with a codec
        that adds more error than the input's own size, the residual grows without settling. Codecs
        that are contractions as they are (int8, int4, fp16, bf16, top-k, none) return ``self``;
        unbiased ones with large variance (ternary) return a scaled copy whose packets any peer still
        decodes with the plain codec.
        """
        return self

    def bits_per_element(self, numel: int, dtype: str = "float32") -> float:
        """Payload bits per element (``8 * payload_nbytes / numel``)."""
        return 8.0 * self.payload_nbytes(numel, dtype) / max(numel, 1)

    def _out(self, flat: torch.Tensor, p: Packet) -> torch.Tensor:
        """Reshape a decoded flat tensor to the packet's shape on this codec's device."""
        out = flat.reshape(p.shape)
        if out.device != self.device:
            out = out.to(self.device)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
