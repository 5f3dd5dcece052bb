"""Byte-level mutations of valid messages, shared by the decoder fuzz tests (hypothesis strategies)."""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["EDIT", "Edit", "mutate"]

Edit = tuple[str, int, int]
#: one edit: (operation, position before wrapping to the message length, byte value)
EDIT = st.tuples(
    st.sampled_from(["flip", "set", "insert", "delete", "cut"]), st.integers(0, 2**16), st.integers(0, 255)
)


def mutate(seed: bytes, edits: list[Edit]) -> bytes:
    """``seed`` with ``edits`` applied in order: flip a bit, set, insert or delete a byte, or truncate."""
    data = bytearray(seed)
    for op, pos, val in edits:
        i = pos % max(len(data), 1)
        if op == "flip" and data:
            data[i] ^= 1 << (val % 8)
        elif op == "set" and data:
            data[i] = val
        elif op == "insert":
            data[i:i] = bytes([val])
        elif op == "delete" and data:
            del data[i]
        elif op == "cut":
            del data[i:]
    return bytes(data)
