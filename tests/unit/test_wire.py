"""swarmtrain.core.wire: round trips, exact sizes, and a typed error for each kind of bad input."""

from __future__ import annotations

import msgpack
import pytest
import torch

import compression
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.packet import Packet
from swarmtrain.core.wire import WIRE_CODECS, decode_packet, encode_packet, packet_nbytes


def _packet(codec: str = "int8", n: int = 100) -> Packet:
    torch.manual_seed(0)
    return compression.make_codec(codec, block=32, fraction=0.1).compress(torch.randn(n))


def test_codec_names_are_all_on_the_wire_allow_list() -> None:
    assert set(compression.codec_names()) <= WIRE_CODECS


@pytest.mark.parametrize("codec", compression.codec_names())
@pytest.mark.parametrize("n", [0, 1, 300, 70_000])
def test_round_trip_and_exact_size(codec: str, n: int) -> None:
    p = _packet(codec, n)
    data = encode_packet(p)
    assert packet_nbytes(p) == len(data)
    q = decode_packet(data)
    assert q == p
    torch.testing.assert_close(compression.decompress_any(q), compression.decompress_any(p), rtol=0, atol=0)


def _raw(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


GOOD = [1, "int8", "float32", [4], [["block", 8]], [b"\x00" * 4, b"\x00" * 4]]


def _with(i: int, value: object) -> bytes:
    obj = list(GOOD)
    obj[i] = value
    return _raw(obj)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "msgpack"),
        (b"\xc1", "msgpack"),
        (_raw({"a": 1}), "max_map_len"),
        (_raw(GOOD[:5]), "6-item"),
        (_with(0, 2), "version"),
        (_with(0, True), "version"),
        (_with(1, "pickle"), "not allowed"),
        (_with(1, 7), "codec"),
        (_with(2, "float64"), "dtype"),
        (_with(3, [2**40]), "shape"),
        (_with(3, [-1]), "shape"),
        (_with(3, [1.5]), "shape"),
        (_with(3, [4096, 4096, 4096]), "exceeds"),
        (_with(3, [1] * 9), "dimensions"),
        (_with(4, [["b", 1], ["a", 1]]), "sorted"),
        (_with(4, [["a", 1], ["a", 1]]), "sorted"),
        (_with(4, [["a", [1]]]), "parameter"),
        (_with(4, [["a", 2**63]]), "int64"),
        (_with(4, [[1, 1]]), "param key"),
        (_with(5, ["text"]), "bin"),
        (_with(5, [b""] * 9), "buffers"),
        (_raw(msgpack.ExtType(5, b"x")), "ext"),
        (b"\x96" + b"\x91" * 200 + b"\x01", "msgpack"),
    ],
)
def test_bad_inputs_raise_protocol_error_naming_the_problem(data: bytes, needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle):
        decode_packet(data)


def test_caps_on_bytes_and_elements() -> None:
    data = encode_packet(_packet("none", 1000))
    with pytest.raises(ProtocolError, match="exceeds"):
        decode_packet(data, max_bytes=len(data) - 1)
    with pytest.raises(ProtocolError, match="999"):
        decode_packet(data, max_numel=999)
    assert decode_packet(data, max_numel=1000, max_bytes=len(data)).numel == 1000
    with pytest.raises(ProtocolError, match="not allowed"):
        decode_packet(data, codecs={"int8"})


def test_non_bytes_input_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        decode_packet("text")  # type: ignore[arg-type]


def test_truncated_packets_are_rejected() -> None:
    data = encode_packet(_packet("int8", 300))
    for cut in range(0, len(data), 7):
        with pytest.raises(ProtocolError):
            decode_packet(data[:cut])
