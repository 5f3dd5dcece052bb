"""The core's one msgpack decoder for peer bytes: bounds, depth and one error type for all bad input."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.safe_msgpack import unpack


def test_round_trip_within_bounds() -> None:
    obj = {"a": [1, 2, {"b": b"xy"}], "c": "d"}
    assert unpack(msgpack.packb(obj), what="t", max_bytes=100, max_bin=8) == obj


@pytest.mark.parametrize(
    ("obj", "kw", "needle"),
    [
        ("x" * 20, {"max_str": 10}, "not valid msgpack"),
        (b"x" * 20, {"max_bin": 10}, "not valid msgpack"),
        (list(range(20)), {"max_array": 10}, "not valid msgpack"),
        ({str(i): i for i in range(20)}, {"max_map": 10}, "not valid msgpack"),
    ],
)
def test_each_container_cap_is_a_protocol_error(obj: object, kw: dict[str, int], needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle):
        unpack(msgpack.packb(obj), what="t", max_bytes=1000, **kw)


def test_size_depth_ext_and_type_are_refused_before_or_while_decoding() -> None:
    with pytest.raises(ProtocolError, match="exceeds the cap"):
        unpack(b"\x90" * 11, what="t", max_bytes=10)
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    with pytest.raises(ProtocolError, match="nests deeper than 16"):
        unpack(msgpack.packb(deep), what="t", max_bytes=1000)
    with pytest.raises(ProtocolError, match="max_ext_len"):
        unpack(msgpack.packb(msgpack.ExtType(3, b"x")), what="t", max_bytes=100, max_bin=10)
    with pytest.raises(ProtocolError, match="must be bytes"):
        unpack("text", what="t", max_bytes=100)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError):
        unpack(b"\x91\x91" * 5000, what="t", max_bytes=100_000, max_array=4)  # deep, truncated


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_arbitrary_bytes_raise_nothing_but_protocol_error(data: bytes) -> None:
    try:
        unpack(data, what="t", max_bytes=200, max_bin=64, max_str=64, max_array=16, max_map=16)
    except ProtocolError:
        pass
