"""SWARM stage messages: what a server or trainer accepts from a peer, and what it refuses."""

from __future__ import annotations

import msgpack
import pytest
import torch

from compression import Int8Compressor, NoneCompressor
from peers.swarm.protocol import (
    StageLimits,
    decode_hidden,
    decode_loss,
    decode_tokens,
    encode_hidden,
    encode_loss,
    encode_tokens,
)
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.packet import Packet
from swarmtrain.core.wire import encode_packet

LIM = StageLimits(stage=1, stages=2, width=8, vocab=50, max_len=16, max_batch=4)


def test_tokens_round_trip_exactly() -> None:
    t = torch.randint(0, 50, (3, 16))
    assert torch.equal(decode_tokens(encode_tokens(t), LIM), t)


@pytest.mark.parametrize(
    "bad",
    [
        torch.full((2, 4), 50),  # outside the vocab
        torch.zeros(5, 4, dtype=torch.long),  # batch over max_batch
        torch.zeros(2, 17, dtype=torch.long),  # longer than the context
    ],
)
def test_tokens_out_of_bounds_refused(bad: torch.Tensor) -> None:
    with pytest.raises(ProtocolError):
        decode_tokens(encode_tokens(bad), LIM)


def test_fractional_or_compressed_tokens_refused() -> None:
    p = Packet("none", (1, 2), "float32", (torch.tensor([[1.5, 2.0]]).numpy().tobytes(),))
    with pytest.raises(ProtocolError, match="integers"):
        decode_tokens(encode_packet(p), LIM)
    with pytest.raises(ProtocolError, match="uncompressed"):
        decode_tokens(encode_hidden(torch.zeros(1, 2, 8), Int8Compressor()), LIM)


def test_hidden_any_codec_and_shape_checks() -> None:
    h = torch.randn(2, 5, 8)
    assert torch.equal(decode_hidden(encode_hidden(h, NoneCompressor()), LIM, expect=(2, 5)), h)
    q = decode_hidden(encode_hidden(h, Int8Compressor()), LIM)
    assert (q - h).abs().max() < 0.05
    with pytest.raises(ProtocolError, match="expected"):
        decode_hidden(encode_hidden(h, NoneCompressor()), LIM, expect=(2, 4))
    with pytest.raises(ProtocolError):
        decode_hidden(encode_hidden(torch.randn(2, 5, 9), NoneCompressor()), LIM)  # wrong width
    with pytest.raises(ProtocolError):
        decode_hidden(encode_hidden(torch.randn(2, 5), NoneCompressor()), LIM)  # wrong rank
    nan = h.clone()
    nan[0, 0, 0] = float("nan")
    with pytest.raises(ProtocolError, match="NaN"):
        decode_hidden(encode_hidden(nan, NoneCompressor()), LIM)


def test_garbage_and_oversized_bytes_refused() -> None:
    for data in (b"", b"\x00" * 10, msgpack.packb({"a": 1}), b"\xff" * (LIM.max_packet + 1)):
        with pytest.raises(ProtocolError):
            decode_hidden(data, LIM)
        with pytest.raises(ProtocolError):
            decode_tokens(data, LIM)


def test_loss_note() -> None:
    assert decode_loss(encode_loss(2.5)) == 2.5
    for bad in ("nan", "-1.0", "inf", "x", "1" * 100):
        with pytest.raises(ProtocolError):
            decode_loss(bad)


def test_request_headers_checked_before_the_body() -> None:
    from dataclasses import replace

    from peers.swarm.server import check_request
    from peers.wire.messages import Envelope

    first = StageLimits(stage=0, stages=2, width=8, vocab=50, max_len=16, max_batch=4)
    ok = Envelope(type="sw_fwd", run="r", kind="activations", round=3, index=0, frames=1, nbytes=100)
    check_request(ok, first, "r")
    check_request(replace(ok, type="sw_bwd", kind="gradients", frames=2), first, "r")
    check_request(replace(ok, index=1, frames=2), LIM, "r")  # the last stage: hidden + targets
    check_request(replace(ok, kind="holds", frames=0, nbytes=0), first, "r")  # a trainer's check
    bad = [
        (replace(ok, kind="holds"), first),  # a holds request carries no frames
        (replace(ok, kind="holds", frames=0), first),
        (replace(ok, run="other"), first),
        (replace(ok, index=1), first),  # another stage
        (replace(ok, type="part"), first),
        (replace(ok, round=-1), first),
        (replace(ok, frames=2), first),
        (replace(ok, kind="gradients"), first),
        (replace(ok, nbytes=first.max_request + 1), first),
        (replace(ok, index=1, type="sw_bwd", kind="gradients", frames=2), LIM),  # no backward to the last
    ]
    for env, lim in bad:
        with pytest.raises(ProtocolError):
            check_request(env, lim, "r")
