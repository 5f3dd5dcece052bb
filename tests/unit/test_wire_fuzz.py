"""Fuzzing the packet decoder and the codecs' decoders with 10,000+ hostile inputs (hypothesis).

Whatever the bytes, ``decode_packet`` followed by ``compression.decompress_any`` either returns a tensor
no larger than the element cap or raises ``ProtocolError``: no other exception, no hang (the timeout
marks are hang guards), no allocation beyond the cap.
"""

from __future__ import annotations

import msgpack
import pytest
import torch
from fuzz_helpers import EDIT, Edit, mutate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compression
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.wire import WIRE_CODECS, decode_packet, encode_packet

CAP = 4096
BATCH = 10  # packets per hypothesis example: 400 + 200 + 400 examples -> 10,000 packets
FUZZ = settings(
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _decode_all_the_way(data: bytes) -> None:
    try:
        p = decode_packet(data, max_numel=CAP, max_bytes=1 << 16)
        out = compression.decompress_any(p)
    except ProtocolError:
        return
    assert isinstance(out, torch.Tensor)
    assert out.numel() == p.numel <= CAP
    assert str(out.dtype).removeprefix("torch.") == p.dtype


def _seeds() -> list[bytes]:
    torch.manual_seed(0)
    out = []
    for name in compression.codec_names():
        codec = compression.make_codec(name, block=8, fraction=0.3)
        for n, dtype in ((13, torch.float32), (40, torch.bfloat16), (1, torch.float16)):
            out.append(encode_packet(codec.compress(torch.randn(n, dtype=dtype))))
    return out


SEEDS = _seeds()


@pytest.mark.timeout(120)
@settings(FUZZ, max_examples=400)
@given(st.lists(st.binary(max_size=400), min_size=BATCH, max_size=BATCH))
def test_random_bytes(batch: list[bytes]) -> None:
    for data in batch:
        _decode_all_the_way(data)


_scalar = st.one_of(
    st.integers(-(2**63), 2**64 - 1), st.floats(), st.booleans(), st.text(max_size=70), st.none()
)
_codec = st.one_of(st.sampled_from(sorted(WIRE_CODECS)), st.text(max_size=10))
_dtype = st.one_of(
    st.sampled_from(["float32", "float16", "bfloat16"]), st.text(max_size=9), st.integers(-(2**63), 2**63)
)
_shape = st.lists(st.integers(-3, 5000), max_size=10)
_params = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["block", "k", "v.block", "x"]), st.one_of(st.integers(-9, 10**7), _scalar)
        ),
        st.lists(_scalar, max_size=3),
    ),
    max_size=4,
).map(lambda ps: [list(p) for p in ps])
_buffers = st.lists(st.binary(max_size=600), max_size=4)


@pytest.mark.timeout(120)
@settings(FUZZ, max_examples=200)
@given(
    st.lists(
        st.tuples(st.sampled_from([1, 1, 1, 0, 2]), _codec, _dtype, _shape, _params, _buffers),
        min_size=BATCH,
        max_size=BATCH,
    )
)
def test_structured_packets(batch: list[tuple[object, ...]]) -> None:
    for fields in batch:
        _decode_all_the_way(msgpack.packb(list(fields), use_bin_type=True))


@pytest.mark.timeout(120)
@settings(FUZZ, max_examples=400)
@given(
    st.lists(
        st.tuples(st.sampled_from(SEEDS), st.lists(EDIT, min_size=1, max_size=4)),
        min_size=BATCH,
        max_size=BATCH,
    )
)
def test_mutated_valid_packets(batch: list[tuple[bytes, list[Edit]]]) -> None:
    for seed, edits in batch:
        _decode_all_the_way(mutate(seed, edits))


def test_seed_packets_decode() -> None:
    """The mutation seeds are valid, so the mutated runs start from real packets."""
    for data in SEEDS:
        _decode_all_the_way(data)
        assert compression.decompress_any(decode_packet(data)).numel() > 0
