"""The safe wire format of a ``Packet``: msgpack, versioned, validated field by field on the way in.

Layout (format version 1), one msgpack array of six items::

    [1, codec: str, dtype: str, shape: [int, ...], params: [[key: str, value], ...], buffers: [bin, ...]]

The decoder trusts nothing. It parses with the core's bounded msgpack decoder
(:func:`swarmtrain.core.safe_msgpack.unpack`: input size, string, binary, array and map lengths,
nesting depth, no ext types), then checks every field: version, codec (allowed when registered in
``swarmtrain.core.registry.CODECS``) and dtype allow-lists, shape
rank and element count, parameter names and scalar types, buffer count and total size. Any violation
raises ``ProtocolError`` saying what was wrong, never another exception. ``pickle`` is never
involved. Checking that the buffers agree with the shape *for the codec* is the codec's job:
``compression`` decoders raise ``ProtocolError`` on inconsistent packets too.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Sequence
from typing import Any

import msgpack

from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.packet import Packet, ParamValue
from swarmtrain.core.registry import CODECS, NamesView
from swarmtrain.core.safe_msgpack import unpack

__all__ = [
    "WIRE_VERSION",
    "WIRE_CODECS",
    "WIRE_DTYPES",
    "MAX_NUMEL",
    "MAX_BYTES",
    "MAX_NDIM",
    "MAX_PARAMS",
    "MAX_BUFFERS",
    "encode_packet",
    "encode_packet_parts",
    "decode_packet",
    "packet_nbytes",
]

WIRE_VERSION = 1
#: Codec names a packet may carry: derived, on every use, from the codec registry (``CODECS``: the
#: built-in codecs once ``compression`` is imported, plus installed plugins), so a codec is allowed
#: exactly when this process can decode it. Empty until ``compression`` registers its codecs, which
#: fails closed (every packet refused).
WIRE_CODECS: NamesView = NamesView(CODECS.wire_names)
WIRE_DTYPES: frozenset[str] = frozenset({"float32", "float16", "bfloat16"})
MAX_NUMEL = 1 << 26  # default cap on decoded elements (64M: 256 MiB of float32)
MAX_BYTES = (1 << 28) + (1 << 16)  # default cap on a packet's wire size
MAX_NDIM = 8
MAX_PARAMS = 16
MAX_BUFFERS = 8
_MAX_NAME = 64
_INT64 = 1 << 63


def _header(p: Packet, buffers: list[bytes]) -> list[Any]:
    return [WIRE_VERSION, p.codec, p.dtype, list(p.shape), [[k, v] for k, v in p.params], buffers]


def encode_packet(p: Packet) -> bytes:
    """Serialise ``p`` (format version 1).

    Raises:
        ProtocolError: ``p`` holds something the format cannot carry (non-bytes buffers, odd params).
    """
    if not isinstance(p, Packet) or any(not isinstance(b, bytes) for b in p.buffers):
        raise ProtocolError("only Packets with bytes buffers can be encoded")
    try:
        return msgpack.packb(_header(p, list(p.buffers)), use_bin_type=True)  # type: ignore[no-any-return]
    except (TypeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"packet cannot be encoded: {e}") from None


def _bin_header(n: int) -> bytes:
    """msgpack's bin header for ``n`` bytes (the smallest form, as ``packb`` writes it)."""
    if n < 1 << 8:
        return b"\xc4" + struct.pack(">B", n)
    if n < 1 << 16:
        return b"\xc5" + struct.pack(">H", n)
    return b"\xc6" + struct.pack(">I", n)


def encode_packet_parts(
    codec: str,
    dtype: str,
    shape: tuple[int, ...],
    params: tuple[tuple[str, ParamValue], ...],
    buffers: Sequence[bytes | memoryview],
) -> list[bytes | memoryview]:
    """``encode_packet`` as segments: the concatenation is the same bytes, the buffers are not copied.

    Buffers may be memoryviews (of pinned host memory, ``compression.staging``); each is sent as
    one msgpack bin after its header.

    Raises:
        ProtocolError: more than ``MAX_BUFFERS`` buffers, or fields the format cannot carry.
    """
    if len(buffers) > MAX_BUFFERS:
        raise ProtocolError(f"a packet carries at most {MAX_BUFFERS} buffers")
    views = [memoryview(b).cast("B") for b in buffers]
    empty = Packet(codec, tuple(shape), dtype, tuple(b"" for _ in views), tuple(params))
    head = encode_packet(empty)  # [1, codec, dtype, shape, params, [bin0, ...]] with empty bins
    head = head[: len(head) - 2 * len(views)]  # drop the empty bins (2 bytes each: c4 00)
    out: list[bytes | memoryview] = []
    for v in views:
        head += _bin_header(len(v))
        out += [head, v] if len(v) else [head]
        head = b""
    return out or [head]


def _bin_overhead(n: int) -> int:
    return 2 if n < 1 << 8 else 3 if n < 1 << 16 else 5


def packet_nbytes(p: Packet) -> int:
    """Exact length of ``encode_packet(p)``, computed without copying the payload."""
    head = len(encode_packet(Packet(p.codec, p.shape, p.dtype, tuple(b"" for _ in p.buffers), p.params)))
    return head + sum(len(b) + _bin_overhead(len(b)) - _bin_overhead(0) for b in p.buffers)


def _check_name(v: Any, what: str) -> str:
    if not isinstance(v, str) or not 0 < len(v) <= _MAX_NAME:
        raise ProtocolError(f"{what} must be a non-empty string of at most {_MAX_NAME} characters")
    return v


def _param_value(k: str, v: Any) -> ParamValue:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        if not -_INT64 <= v < _INT64:
            raise ProtocolError(f"parameter {k!r} is out of int64 range")
        return v
    if isinstance(v, float):
        return v
    if isinstance(v, str) and len(v) <= _MAX_NAME:
        return v
    raise ProtocolError(f"parameter {k!r} must be a bool, int, float or short string")


def decode_packet(
    data: bytes,
    *,
    max_numel: int = MAX_NUMEL,
    max_bytes: int = MAX_BYTES,
    codecs: Collection[str] | None = None,
) -> Packet:
    """Parse and validate a packet received from a peer.

    Args:
        data: the bytes as received.
        max_numel: largest decoded element count accepted (bounds what a decoder will allocate).
        max_bytes: largest wire size accepted.
        codecs: codec names accepted (default: ``WIRE_CODECS``).

    Raises:
        ProtocolError: for every malformed, oversized or inconsistent input, naming the problem.
    """
    # The layout needs no maps and no nesting beyond [.., shape, [[key, value], ...], [bin, ...]].
    obj = unpack(
        data,
        what="packet",
        max_bytes=max_bytes,
        max_str=_MAX_NAME * 4,
        max_bin=max_bytes,
        max_array=max(MAX_NDIM, MAX_PARAMS, MAX_BUFFERS, 6),
        max_map=0,
    )
    if not isinstance(obj, list) or len(obj) != 6:
        raise ProtocolError("packet must be a 6-item msgpack array")
    version, codec, dtype, shape, params, buffers = obj
    if type(version) is not int or version != WIRE_VERSION:
        raise ProtocolError(f"unsupported packet format version {version!r:.20}")
    allowed = CODECS.wire_names() if codecs is None else codecs
    if _check_name(codec, "codec") not in allowed:
        raise ProtocolError(f"codec {codec!r} is not allowed")
    if _check_name(dtype, "dtype") not in WIRE_DTYPES:
        raise ProtocolError(f"dtype {dtype!r} is not allowed")
    shape = _check_shape(shape, max_numel)
    pairs = _check_params(params)
    if not isinstance(buffers, list) or len(buffers) > MAX_BUFFERS:
        raise ProtocolError(f"buffers must be a list of at most {MAX_BUFFERS} byte strings")
    if any(not isinstance(b, bytes) for b in buffers):
        raise ProtocolError("buffers must be msgpack bin values")
    return Packet(codec=codec, shape=shape, dtype=dtype, buffers=tuple(buffers), params=pairs)


def _check_shape(shape: Any, max_numel: int) -> tuple[int, ...]:
    """A received shape: at most ``MAX_NDIM`` ints, none and their product not over ``max_numel``."""
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise ProtocolError(f"shape must be a list of at most {MAX_NDIM} dimensions")
    numel = 1
    for s in shape:
        if type(s) is not int or not 0 <= s <= max_numel:
            raise ProtocolError(f"shape entry {s!r:.20} is not an int in [0, {max_numel}]")
        numel *= s
    if numel > max_numel:
        raise ProtocolError(f"packet of {numel} elements exceeds the cap of {max_numel}")
    return tuple(shape)


def _check_params(params: Any) -> tuple[tuple[str, ParamValue], ...]:
    """Received codec parameters: at most ``MAX_PARAMS`` ``[key, value]`` pairs, keys unique and sorted."""
    if not isinstance(params, list) or len(params) > MAX_PARAMS:
        raise ProtocolError(f"params must be a list of at most {MAX_PARAMS} pairs")
    pairs: list[tuple[str, ParamValue]] = []
    for item in params:
        if not isinstance(item, list) or len(item) != 2:
            raise ProtocolError("each param must be a [key, value] pair")
        k = _check_name(item[0], "param key")
        pairs.append((k, _param_value(k, item[1])))
    keys = [k for k, _ in pairs]
    if keys != sorted(set(keys)):
        raise ProtocolError("param keys must be unique and sorted")
    return tuple(pairs)
