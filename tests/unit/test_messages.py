"""Message framing, peer records and group records: every malformed input is a ProtocolError."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peers.dht.records import PeerRecord, decode_record, encode_record
from peers.rounds.rounds import _decode_members, group_digest
from peers.wire.messages import (
    MAX_FRAME,
    Envelope,
    decode_ack,
    decode_envelope,
    decode_frame_length,
    decode_packet_bytes,
    encode_ack,
    encode_envelope,
    encode_frame_length,
    encode_packet_bytes,
)
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.packet import Packet


def test_envelope_roundtrip() -> None:
    env = Envelope(
        type="part",
        run="r1",
        kind="reduce",
        round=3,
        digest=b"x" * 24,
        index=2,
        weight=1.5,
        frames=4,
        nbytes=1000,
        numel=77,
        note="hi",
    )
    assert decode_envelope(encode_envelope(env)) == env
    assert decode_ack(encode_ack(False, "nope")) == (False, "nope")


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "evil", "run": "r", "kind": "k", "round": 0},
        {"type": "part", "run": "r", "kind": "k"},
        {"type": "part", "run": "r", "kind": "k", "round": "0"},
        {"type": "part", "run": "r", "kind": "k", "round": True},
        {"type": "part", "run": "r", "kind": "k", "round": 0, "weight": float("nan")},
        {"type": "part", "run": "r", "kind": "k", "round": 0, "weight": -1.0},
        {"type": "part", "run": "r", "kind": "k", "round": 0, "frames": -1},
        {"type": "part", "run": "r", "kind": "k", "round": 0, "digest": b"x" * 65},
        {"type": "part", "run": "r", "kind": "k", "round": 0, "extra_field": 1},
        {"type": "part", "run": "r" * 300, "kind": "k", "round": 0},
        [1, 2, 3],
    ],
)
def test_envelope_rejects_bad_fields(bad: object) -> None:
    with pytest.raises(ProtocolError):
        decode_envelope(msgpack.packb(bad, use_bin_type=True))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_envelope_fuzz_only_protocol_errors(data: bytes) -> None:
    try:
        decode_envelope(data)
    except ProtocolError:
        pass


def test_frame_length_bounds() -> None:
    assert decode_frame_length(encode_frame_length(123)) == 123
    with pytest.raises(ProtocolError):
        encode_frame_length(MAX_FRAME + 1)
    with pytest.raises(ProtocolError):
        decode_frame_length((MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(ProtocolError):
        decode_frame_length(b"\x00\x01", limit=10)
    with pytest.raises(ProtocolError):
        decode_frame_length((11).to_bytes(4, "big"), limit=10)


def test_packet_roundtrip_and_bounds() -> None:
    p = Packet("none", (3,), "float32", (b"\x00" * 12,), (("k", 1),))
    q = decode_packet_bytes(encode_packet_bytes(p))
    assert q.codec == p.codec and q.shape == p.shape and q.dtype == p.dtype and q.buffers == p.buffers
    with pytest.raises(ProtocolError):
        decode_packet_bytes(b"\x00" * 100, max_bytes=10)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_packet_fuzz_only_protocol_errors(data: bytes) -> None:
    try:
        decode_packet_bytes(data)
    except ProtocolError:
        pass


def test_record_roundtrip_and_validation() -> None:
    rec = PeerRecord(
        peer_id="Qm1",
        run_id="r",
        step=5,
        round=2,
        loss=2.5,
        throughput=10.5,
        maddrs=("/ip4/1.2.3.4/tcp/1",),
        extra={"tokens": 12},
    )
    assert decode_record(encode_record(rec)) == rec
    good = msgpack.unpackb(encode_record(rec))
    for field, value in [
        ("step", -1),
        ("throughput", float("inf")),
        ("maddrs", "x"),
        ("left", 1),
        ("extra", {"a": [1]}),
        ("peer_id", 5),
    ]:
        with pytest.raises(ProtocolError):
            decode_record(msgpack.packb({**good, field: value}, use_bin_type=True))
    with pytest.raises(ProtocolError):
        decode_record("not bytes")
    with pytest.raises(ProtocolError):
        decode_record(b"\xc1")
    newer = msgpack.packb({**good, "future_field": 1}, use_bin_type=True)
    assert decode_record(newer).peer_id == "Qm1"  # unknown fields of newer peers are ignored


def test_group_records() -> None:
    assert _decode_members(msgpack.packb(["a", "b"])) == ("a", "b")
    for bad in (["b", "a"], ["a", "a"], [], [1], {"a": 1}):
        with pytest.raises(ProtocolError):
            _decode_members(msgpack.packb(bad))
    assert group_digest("r", "reduce", 1, ("a", "b")) != group_digest("r", "reduce", 2, ("a", "b"))
    assert len(group_digest("r", "reduce", 1, ("a",))) == 16
