"""A donor's state bytes that nest deeply are a ProtocolError / CheckpointError, never a RecursionError."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from peers.state.state_transfer import META_KEY, parse_state, serialize_state
from swarmtrain.app.train.checkpoint import CheckpointError, pack_state, unpack_state
from swarmtrain.core.errors import ProtocolError


def _raw_state(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


def test_a_header_nested_5000_deep_is_a_protocol_error() -> None:
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(ProtocolError, match="nests too deeply"):
        parse_state(_raw_state(deep.encode()))
    meta_deep = json.dumps({"__metadata__": {META_KEY: deep}}).encode()
    with pytest.raises(ProtocolError, match="nests too deeply"):
        parse_state(_raw_state(meta_deep))


def test_a_skeleton_nested_deeper_than_the_cap_is_a_checkpoint_error() -> None:
    tensors, skeleton = pack_state({"a": [torch.ones(2), {"b": (1, 2.5)}]}, prefix="s")
    assert torch.equal(unpack_state(skeleton, tensors)["a"][0], torch.ones(2))
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(CheckpointError, match="nests deeper"):
        unpack_state(deep, {})


def test_a_real_state_still_parses() -> None:
    data = serialize_state({"w": torch.arange(4.0)}, {"round": 3, "nested": [[1, [2]]]})
    tensors, meta = parse_state(data)
    assert torch.equal(tensors["w"], torch.arange(4.0)) and meta["round"] == 3
