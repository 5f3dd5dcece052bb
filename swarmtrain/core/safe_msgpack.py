"""The one msgpack decoder for bytes that came from a peer: bounded sizes and nesting, typed errors.

msgpack's own limits (``max_str_len``, ``max_bin_len``, ``max_array_len``, ``max_map_len``) bound
each container, and its C unpacker refuses nesting beyond its stack with a ``StackError``. Bad input
raises a handful of unrelated exception types (``ExtraData``, ``FormatError``, ``ValueError``,
``TypeError``, ``StackError``, ...); every one of them becomes a :class:`ProtocolError` here, so a
caller catches exactly one type. Extension types are refused outright, and map keys must be strings
or bytes (``strict_map_key``), so no decoded value is ever a Python object of the peer's choosing.
"""

from __future__ import annotations

from typing import Any

import msgpack

from swarmtrain.core.errors import ProtocolError

__all__ = ["unpack", "MAX_DEPTH"]

MAX_DEPTH = 16  # no record or header of this project nests deeper


def _no_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack extension type {code} is not allowed")


def unpack(
    data: bytes | bytearray | memoryview,
    *,
    what: str,
    max_bytes: int,
    max_str: int = 1024,
    max_bin: int = 0,
    max_array: int = 64,
    max_map: int = 64,
    max_depth: int = MAX_DEPTH,
) -> Any:
    """Decode one msgpack object from untrusted ``data`` within the given bounds.

    Args:
        data: the bytes as received.
        what: a few words naming the object, for the error message (``"peer record"``).
        max_bytes: the whole input's cap; checked before decoding.
        max_str / max_bin / max_array / max_map: caps on each string, binary, array and map.
        max_depth: cap on container nesting (the top level counts as 1).

    Raises:
        ProtocolError: input that is not bytes, too large, too deep, or not valid bounded msgpack.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError(f"{what} must be bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise ProtocolError(f"{what} of {len(data)} bytes exceeds the cap of {max_bytes}")
    try:
        obj = msgpack.unpackb(
            bytes(data),
            raw=False,
            use_list=True,
            strict_map_key=True,
            ext_hook=_no_ext,
            max_str_len=max_str,
            max_bin_len=max_bin,
            max_array_len=max_array,
            max_map_len=max_map,
            max_ext_len=0,
        )
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises many unrelated types on bad input
        raise ProtocolError(f"{what} is not valid msgpack: {type(e).__name__}: {str(e)[:100]}") from None
    if _depth(obj, max_depth) > max_depth:
        raise ProtocolError(f"{what} nests deeper than {max_depth} levels")
    return obj


def _depth(obj: Any, limit: int) -> int:
    """Nesting depth of ``obj`` (scalars 0), iterative and stopping once past ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        cur, d = stack.pop()
        if isinstance(cur, list):
            children: Any = cur
        elif isinstance(cur, dict):
            children = list(cur.values())
        else:
            continue
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((c, d + 1) for c in children)
    return deepest
