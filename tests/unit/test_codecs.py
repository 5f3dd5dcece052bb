"""Codec properties (hypothesis): documented error bounds, exact sizes, dtypes/shapes, determinism,
and typed errors for inconsistent packets."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import compression
from swarmtrain.core.config import CompressionConfig
from swarmtrain.core.errors import ConfigError, ProtocolError, UpdateRejected
from swarmtrain.core.packet import Packet
from swarmtrain.core.protocols import Compressor

PROPS = settings(max_examples=60, deadline=None, derandomize=True)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

_floats = st.floats(-1e4, 1e4, allow_nan=False, width=32)
_vectors = st.one_of(
    arrays(np.float32, st.integers(0, 600), elements=_floats),
    st.tuples(st.integers(0, 600), st.integers(0, 2**31)).map(
        lambda a: (
            np.random.default_rng(a[1]).standard_normal(a[0]).astype(np.float32)
            * np.float32(10.0 ** np.random.default_rng(a[1]).integers(-6, 4))
        )
    ),
)


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """Per-element absmax of its block, [n]."""
    n = x.numel()
    pad = torch.zeros((-n) % block)
    xb = torch.cat([x.abs().float(), pad]).reshape(-1, block)
    return xb.amax(1, keepdim=True).expand_as(xb).reshape(-1)[:n]


@pytest.mark.parametrize("name", compression.codec_names())
def test_every_codec_is_a_compressor_with_exact_sizes(name: str) -> None:
    codec = compression.make_codec(name, block=16, fraction=0.2)
    assert isinstance(codec, Compressor)
    assert codec.name == name
    for dtype in DTYPES:
        for shape in [(), (0,), (1,), (3, 5), (2, 3, 37), (257,), (70_000,)]:
            x = torch.randn(shape).to(dtype)
            p = codec.compress(x, key="w")
            assert p.codec == name and p.shape == tuple(shape)
            assert p.payload_nbytes == codec.payload_nbytes(x.numel(), p.dtype)
            y = codec.decompress(p)
            assert y.dtype == dtype and y.shape == x.shape


@PROPS
@given(_vectors, st.sampled_from([8, 16, 64, 256]))
def test_int8_error_bound(x_np: np.ndarray, block: int) -> None:
    x = torch.from_numpy(x_np)
    y = compression.Int8Compressor(block).decompress(compression.Int8Compressor(block).compress(x))
    bound = _blocks(x, block) / 254
    assert bool(((y - x).abs() <= bound * (1 + 1e-5) + 1e-30).all())


@PROPS
@given(_vectors, st.sampled_from([8, 32, 256]))
def test_int4_error_bound(x_np: np.ndarray, block: int) -> None:
    x = torch.from_numpy(x_np)
    c = compression.Int4Compressor(block)
    y = c.decompress(c.compress(x))
    bound = _blocks(x, block) / 14
    assert bool(((y - x).abs() <= bound * (1 + 1e-5) + 1e-30).all())


@pytest.mark.parametrize("name,qmax", [("int8", 127), ("int4", 7)])
@pytest.mark.parametrize("exponent", [-20, -30, -37, -40, -44])
def test_blockwise_error_bound_holds_for_tiny_blocks(name: str, qmax: int, exponent: int) -> None:
    """Blocks with absmax far below 1 (down to subnormals) keep the bound: ``qmax / absmax`` would
    overflow float32 there, so the encoder scales such blocks by 2**64 first. The only extra error is
    the scale's own rounding on the subnormal grid (at most qmax * 2**-150 after decoding)."""
    x = torch.randn(4096, generator=torch.Generator().manual_seed(-exponent)) * 10.0**exponent
    x[::9] = 0.0
    for native in ("1", "0"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SWARMTRAIN_NATIVE_CODECS", native)
            codec = compression.make_codec(name, block=64)
            y = codec.decompress(codec.compress(x))
        bound = _blocks(x, 64) / (2 * qmax) * (1 + 1e-5) + qmax * 2.0**-150
        assert bool(((y - x).abs() <= bound).all()), native
        assert bool((y[::9] == 0).all())


@PROPS
@given(_vectors, st.sampled_from([8, 64]))
def test_ternary_decodes_to_zero_or_signed_block_absmax(x_np: np.ndarray, block: int) -> None:
    x = torch.from_numpy(x_np)
    c = compression.TernaryCompressor(block, seed=1)
    y = c.decompress(c.compress(x))
    am = _blocks(x, block)
    ok = (y == 0) | ((y == am * torch.sign(x)) & (x != 0))
    assert bool(ok.all())


@PROPS
@given(_vectors)
def test_fp16_and_bf16_error_bounds(x_np: np.ndarray) -> None:
    x = torch.from_numpy(x_np)
    y16 = compression.FP16Compressor().decompress(compression.FP16Compressor().compress(x))
    assert bool(((y16 - x).abs() <= torch.maximum(x.abs() * 2.0**-11, torch.tensor(2.0**-25))).all())
    yb = compression.BF16Compressor().decompress(compression.BF16Compressor().compress(x))
    # relative 2^-8, or bf16's subnormal spacing (2^-133) for values that small (3.9e-44 -> 0)
    assert bool(((yb - x).abs() <= torch.maximum(x.abs() * 2.0**-8, torch.tensor(2.0**-133))).all())
    yn = compression.NoneCompressor().decompress(compression.NoneCompressor().compress(x))
    assert torch.equal(yn, x)


@PROPS
@given(_vectors, st.integers(1, 50), st.sampled_from(list(compression.VALUE_CODECS)))
def test_topk_keeps_the_largest_and_zeroes_the_rest(x_np: np.ndarray, k: int, inner: str) -> None:
    x = torch.from_numpy(x_np)
    c = compression.make_codec(f"topk+{inner}", k=k, block=8)
    p = c.compress(x)
    y = c.decompress(p)
    kk = min(k, x.numel())
    kept = y != 0
    assert int(kept.sum()) <= kk
    if kk and inner == "none":
        kth = x.abs().topk(kk).values[-1]
        assert bool((x.abs()[~kept] <= kth).all())  # nothing dropped beats the k-th magnitude
        assert torch.equal(y[kept], x[kept])


def test_topk_index_width_is_the_narrowest_that_fits() -> None:
    c = compression.TopKCompressor(k=4)
    widths = {n: len(c.compress(torch.randn(n)).buffers[0]) // 4 for n in (256, 257, 65_536, 65_537)}
    assert widths == {256: 1, 257: 2, 65_536: 2, 65_537: 4}


@pytest.mark.parametrize("name", ["int8", "int4", "ternary", "topk+int8", "fp16"])
def test_decoding_is_deterministic_and_leaves_the_packet_untouched(name: str) -> None:
    codec = compression.make_codec(name, block=32, fraction=0.3)
    p = codec.compress(torch.randn(1000), key="a")
    frozen = dataclasses.replace(p)
    a, b = codec.decompress(p), compression.decompress_any(p)
    assert torch.equal(a, b) and p == frozen
    a.add_(1.0)  # outputs are fresh tensors: writing them never touches the packet bytes
    assert torch.equal(codec.decompress(p), b)


def test_ternary_is_reproducible_from_its_seed_and_fresh_per_call() -> None:
    x = torch.randn(5000)
    a, b = compression.TernaryCompressor(64, seed=3), compression.TernaryCompressor(64, seed=3)
    pa1, pa2 = a.compress(x, key="w"), a.compress(x, key="w")
    assert pa1 == b.compress(x, key="w") and pa1 != pa2
    c = compression.TernaryCompressor(64, seed=0)
    c.load_state_dict(a.state_dict())
    assert c.compress(x, key="w") == a.compress(x, key="w")


@pytest.mark.parametrize("name", ["int8", "int4", "ternary"])
def test_non_finite_inputs_are_rejected(name: str) -> None:
    codec = compression.make_codec(name, block=8)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(UpdateRejected):
            codec.compress(torch.tensor([1.0, bad, 0.0]))
    with pytest.raises(UpdateRejected):
        compression.FP16Compressor().compress(torch.tensor([1e6]))
    with pytest.raises(ConfigError):
        codec.compress(torch.arange(4))


def _bad_variants(p: Packet) -> list[Packet]:
    r = dataclasses.replace
    out = [
        r(p, codec="int4" if p.codec != "int4" else "int8"),
        r(p, dtype="float64"),
        r(p, shape=p.shape + (2,)),
        r(p, shape=(p.numel + 1,)),
        r(p, shape=(p.numel * 1000,)),
        r(p, buffers=p.buffers[:-1]),
        r(p, buffers=p.buffers + (b"",)),
        r(p, buffers=tuple(b[:-1] for b in p.buffers)),
        r(p, buffers=tuple(b + b"\x00" for b in p.buffers)),
        r(p, params=()),
        r(p, params=tuple((k, -1) for k, _ in p.params)),
        r(p, params=tuple((k, True) for k, _ in p.params)),
        r(p, params=tuple((k, 12) for k, _ in p.params)),
    ]
    return [q for q in out if q != p]


@pytest.mark.parametrize("name", compression.codec_names())
def test_inconsistent_packets_raise_protocol_error(name: str) -> None:
    codec = compression.make_codec(name, block=16, fraction=0.25)
    p = codec.compress(torch.randn(100))
    for bad in _bad_variants(p):
        if name.startswith("topk") and bad.numel <= 256 and (bad.codec, bad.buffers) == (p.codec, p.buffers):
            continue  # top-k of 25 out of 101 or 200 elements is a valid packet, not an inconsistent one
        with pytest.raises(ProtocolError):
            codec.decompress(bad)


def test_hostile_values_are_rejected() -> None:
    p = compression.Int8Compressor(8).compress(torch.randn(16))
    nan_scales = np.frombuffer(p.buffers[1], "<f4").copy()
    nan_scales[0] = np.nan
    with pytest.raises(ProtocolError, match="scales"):
        compression.decompress_any(dataclasses.replace(p, buffers=(p.buffers[0], nan_scales.tobytes())))
    half = compression.Int8Compressor(8).compress(torch.randn(16, dtype=torch.float16))
    huge = np.full(2, 1e6, "<f4").tobytes()  # would overflow float16 on decode
    with pytest.raises(ProtocolError, match="scales"):
        compression.decompress_any(dataclasses.replace(half, buffers=(half.buffers[0], huge)))
    t = compression.TopKCompressor(k=3).compress(torch.randn(50))
    for idx in ([3, 3, 5], [5, 3, 4], [1, 2, 50]):
        bad = dataclasses.replace(t, buffers=(np.array(idx, "u1").tobytes(), t.buffers[1]))
        with pytest.raises(ProtocolError, match="indices"):
            compression.decompress_any(bad)
    with pytest.raises(ProtocolError, match="unknown codec"):
        compression.decompress_any(dataclasses.replace(p, codec="zstd"))


@pytest.mark.parametrize(
    ("cfg", "kind", "name"),
    [
        (CompressionConfig(codec="int8", block_size=64), compression.Int8Compressor, "int8"),
        (CompressionConfig(codec="topk+int8", topk_fraction=0.1), compression.TopKCompressor, "topk+int8"),
        (CompressionConfig(codec="topk"), compression.TopKCompressor, "topk"),
        (CompressionConfig(codec="ternary", error_feedback="ef"), compression.ErrorFeedback, "ternary"),
        (CompressionConfig(codec="int4", error_feedback="ef21"), compression.EF21, "int4"),
        (CompressionConfig(), compression.NoneCompressor, "none"),
    ],
)
def test_build_compressor(cfg: CompressionConfig, kind: type, name: str) -> None:
    codec = compression.build_compressor(cfg)
    assert isinstance(codec, kind) and codec.name == name
    x = torch.randn(300)
    assert codec.decompress(codec.compress(x, key="k")).shape == x.shape


@pytest.mark.parametrize("bad", ["int9", "topk+topk", "int8+topk", "topk+zstd", ""])
def test_unknown_names_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError):
        compression.build_compressor(CompressionConfig(codec=bad))


def test_block_must_be_a_multiple_of_8() -> None:
    with pytest.raises(ConfigError):
        compression.build_compressor(CompressionConfig(codec="int8", block_size=100))


_CHILD = """
import hashlib, sys, torch
import compression
from swarmtrain.core.wire import encode_packet
torch.set_num_threads(1)
x = torch.randn(5000, generator=torch.Generator().manual_seed(11))
for name in sys.argv[1:]:
    c = compression.make_codec(name, block=64, fraction=0.1, seed=2)
    data = encode_packet(c.compress(x, key="w"))
    y = c.decompress(c.compress(x, key="w"))
    print(name, hashlib.sha256(data).hexdigest(), hashlib.sha256(y.numpy().tobytes()).hexdigest())
"""


def test_packets_and_decodes_are_identical_across_processes_and_thread_counts() -> None:
    """Another process (one thread, fresh interpreter) makes the same packet bytes and decodes."""
    import hashlib
    import subprocess
    import sys

    from swarmtrain.core.wire import encode_packet

    names = ["int8", "int4", "ternary", "topk+int8", "bf16"]
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, *names], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split("\n")
    x = torch.randn(5000, generator=torch.Generator().manual_seed(11))
    for name, line in zip(names, child, strict=False):
        c = compression.make_codec(name, block=64, fraction=0.1, seed=2)
        data = encode_packet(c.compress(x, key="w"))
        y = c.decompress(c.compress(x, key="w"))
        mine = f"{name} {hashlib.sha256(data).hexdigest()} {hashlib.sha256(y.numpy().tobytes()).hexdigest()}"
        assert line == mine
