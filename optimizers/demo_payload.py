"""DeMo's wire payload: per tensor, the top-k DCT coefficients of each chunk as (index, value) pairs.

Packing (our own, little-endian), one msgpack map per peer and step::

    {"v": 1, "vals": "fp32" | "fp16" | "bf16" | "sign", "t": [[idx, val, scale], ...]}

one ``[idx, val, scale]`` entry per trainable tensor, in the model's parameter order:

* ``idx``: ``n_chunks * k`` indices within a chunk, in the narrowest unsigned type that holds
  ``chunk_numel - 1`` (uint8, uint16 or uint32);
* ``val``: the ``n_chunks * k`` values as fp32/fp16/bf16, or (``"sign"``) one bit per value
  (1 = non-negative, ``numpy.packbits`` order);
* ``scale``: empty, or (``"sign"``) one fp32: the mean absolute value the signs stand for.

Everything in a payload comes from a peer and is untrusted: the decoder bounds the size before
unpacking, checks every field's type and exact byte length against the receiver's own model, checks
index range and uniqueness per chunk and value finiteness, and raises ``ProtocolError`` otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgpack
import numpy as np
import torch

from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.safe_msgpack import unpack

__all__ = [
    "VALUE_MODES",
    "TensorSpec",
    "index_dtype",
    "encode_payload",
    "decode_payload",
    "max_payload_bytes",
]

VERSION = 1
VALUE_MODES = ("fp32", "fp16", "bf16", "sign")
_VAL_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class TensorSpec:
    """What the receiver expects for one tensor: ``n_chunks`` rows of ``k`` picks among ``chunk_numel``."""

    n_chunks: int
    k: int
    chunk_numel: int

    @property
    def count(self) -> int:
        """Number of (index, value) pairs."""
        return self.n_chunks * self.k


def index_dtype(chunk_numel: int) -> np.dtype:
    """Narrowest little-endian unsigned dtype able to hold indices ``0 .. chunk_numel - 1``."""
    if chunk_numel <= 1 << 8:
        return np.dtype("<u1")
    if chunk_numel <= 1 << 16:
        return np.dtype("<u2")
    return np.dtype("<u4")


def _val_nbytes(spec: TensorSpec, mode: str) -> int:
    if mode == "sign":
        return (spec.count + 7) // 8
    return spec.count * _VAL_BYTES[mode]


def max_payload_bytes(specs: list[TensorSpec], mode: str) -> int:
    """An upper bound on an honest payload's size (the decoder refuses anything larger)."""
    body = sum(
        spec.count * index_dtype(spec.chunk_numel).itemsize + _val_nbytes(spec, mode) + 4 for spec in specs
    )
    return body + 16 * len(specs) + 64


def encode_payload(
    items: list[tuple[torch.Tensor, torch.Tensor]], specs: list[TensorSpec], mode: str
) -> bytes:
    """Pack ``(idx [n_chunks, k] int64, val [n_chunks, k] float)`` per tensor.

    Raises:
        ConfigError: unknown value mode or items that do not match ``specs``.
    """
    if mode not in VALUE_MODES:
        raise ConfigError(f"DeMo value mode {mode!r}; choose one of {', '.join(VALUE_MODES)}")
    if len(items) != len(specs):
        raise ConfigError("encode_payload: one (idx, val) pair per spec is required")
    entries: list[list[bytes]] = []
    for (idx, val), spec in zip(items, specs, strict=True):
        if idx.shape != (spec.n_chunks, spec.k) or val.shape != (spec.n_chunks, spec.k):
            raise ConfigError(f"encode_payload: expected [{spec.n_chunks}, {spec.k}] tensors")
        ib = idx.detach().cpu().numpy().astype(index_dtype(spec.chunk_numel)).tobytes()
        v = val.detach().cpu().to(torch.float32).reshape(-1)
        scale = b""
        if mode == "sign":
            vb = np.packbits((v >= 0).numpy()).tobytes()
            scale = np.asarray([v.abs().mean().item() if v.numel() else 0.0], dtype="<f4").tobytes()
        elif mode == "bf16":
            vb = v.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
        else:
            if mode == "fp16":  # keep finite: the decoder rejects inf
                v = v.clamp(-65504.0, 65504.0)
            vb = v.numpy().astype("<f4" if mode == "fp32" else "<f2").tobytes()
        entries.append([ib, vb, scale])
    out: bytes = msgpack.packb({"v": VERSION, "vals": mode, "t": entries}, use_bin_type=True)
    return out


def _decode_values(vb: bytes, scale: bytes, spec: TensorSpec, mode: str) -> torch.Tensor:
    if mode == "sign":
        if len(scale) != 4:
            raise ProtocolError("sign payload: scale must be one fp32")
        s = float(np.frombuffer(scale, dtype="<f4")[0])
        if not math.isfinite(s) or s < 0:
            raise ProtocolError("sign payload: scale must be finite and non-negative")
        bits = np.unpackbits(np.frombuffer(vb, dtype=np.uint8))[: spec.count].astype(np.float32)
        return torch.from_numpy(bits * 2.0 - 1.0) * s
    if scale:
        raise ProtocolError(f"{mode} payload: unexpected scale field")
    if mode == "bf16":
        raw = np.frombuffer(vb, dtype="<i2").astype(np.int16)
        return torch.from_numpy(raw).view(torch.bfloat16).to(torch.float32)
    arr = np.frombuffer(vb, dtype="<f4" if mode == "fp32" else "<f2").astype(np.float32)
    return torch.from_numpy(arr)


def decode_payload(
    data: bytes, specs: list[TensorSpec], mode: str
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Validate and unpack a peer's payload into ``(idx int64, val float32)`` of ``[n_chunks, k]``.

    Raises:
        ProtocolError: anything malformed, oversized, out of range, duplicated or non-finite.
    """
    limit = max_payload_bytes(specs, mode)
    if not isinstance(data, bytes | bytearray) or len(data) > limit:
        raise ProtocolError(f"DeMo payload of {len(data)} bytes exceeds the bound of {limit}")
    obj = unpack(
        data,
        what="DeMo payload",
        max_bytes=limit,
        max_str=16,
        max_bin=limit,
        max_array=max(3, len(specs)),
        max_map=3,
    )
    if not isinstance(obj, dict) or set(obj) != {"v", "vals", "t"}:
        raise ProtocolError("DeMo payload: expected a map with keys v, vals, t")
    if obj["v"] != VERSION:
        raise ProtocolError(f"DeMo payload: unsupported version {obj['v']!r}")
    if obj["vals"] != mode:
        raise ProtocolError(f"DeMo payload: value mode {obj['vals']!r}, expected {mode!r}")
    entries = obj["t"]
    if not isinstance(entries, list) or len(entries) != len(specs):
        raise ProtocolError(f"DeMo payload: expected {len(specs)} tensors")
    out: list[tuple[torch.Tensor, torch.Tensor]] = []
    for i, (entry, spec) in enumerate(zip(entries, specs, strict=True)):
        if not isinstance(entry, list) or len(entry) != 3 or not all(isinstance(b, bytes) for b in entry):
            raise ProtocolError(f"DeMo payload tensor {i}: expected [idx, val, scale] byte strings")
        ib, vb, scale = entry
        idt = index_dtype(spec.chunk_numel)
        if len(ib) != spec.count * idt.itemsize or len(vb) != _val_nbytes(spec, mode):
            raise ProtocolError(f"DeMo payload tensor {i}: wrong byte length")
        idx_np = np.frombuffer(ib, dtype=idt).astype(np.int64).reshape(spec.n_chunks, spec.k)
        if idx_np.size and int(idx_np.max()) >= spec.chunk_numel:
            raise ProtocolError(f"DeMo payload tensor {i}: index out of range")
        srt = np.sort(idx_np, axis=1)
        if spec.k > 1 and bool((srt[:, 1:] == srt[:, :-1]).any()):
            raise ProtocolError(f"DeMo payload tensor {i}: duplicate index within a chunk")
        val = _decode_values(vb, scale, spec, mode).reshape(spec.n_chunks, spec.k)
        if not bool(torch.isfinite(val).all()):
            raise ProtocolError(f"DeMo payload tensor {i}: non-finite value")
        out.append((torch.from_numpy(idx_np), val))
    return out
