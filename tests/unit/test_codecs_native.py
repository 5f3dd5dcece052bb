"""The native C encoder (``compression.native``) makes byte-for-byte the packets of the torch path, on
random and edge-case inputs (ties at .5, zeros and -0.0, tiny and huge values, short last blocks,
non-finite values), and the codecs fall back to torch cleanly when it cannot be built."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import compression
from compression import native
from compression.native import ENV_NATIVE, ENV_NATIVE_DIR
from swarmtrain.core.errors import UpdateRejected
from swarmtrain.core.packet import Packet

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler: native path not built")

CODECS = ["int8", "int4", "ternary"]
PROPS = settings(max_examples=80, deadline=None, derandomize=True)

_specials = st.sampled_from([0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e-38, -1e-45, 3e38, 65504.0])
_elems = st.one_of(st.floats(-1e6, 1e6, allow_nan=False, width=32), _specials)


def _encode(
    monkeypatch: pytest.MonkeyPatch, name: str, x: torch.Tensor, block: int, mode: str
) -> Packet | str:
    """The packet of ``name`` on ``x`` with the native kernel on (``"1"``) or off (``"0"``)."""
    monkeypatch.setenv(ENV_NATIVE, mode)
    codec = compression.make_codec(name, block=block, seed=7)
    try:
        return codec.compress(x, key="w")
    except UpdateRejected:
        return "rejected"


def test_the_kernel_builds_here() -> None:
    assert native.available(), "cc is present, so the native kernel must build"


@PROPS
@given(
    arrays(np.float32, st.integers(8, 700), elements=_elems),
    st.sampled_from([8, 16, 24, 64, 256]),
    st.sampled_from(CODECS),
)
def test_native_packets_equal_the_torch_packets(x_np: np.ndarray, block: int, name: str) -> None:
    x = torch.from_numpy(x_np)
    with pytest.MonkeyPatch.context() as mp:
        fast, ref = _encode(mp, name, x, block, "1"), _encode(mp, name, x, block, "0")
    assert fast == ref


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("n", [8, 1023, 3 * 1024 + 77, (1 << 18) + 5])
@pytest.mark.parametrize("kind", ["randn", "halves", "scaled", "tiny", "inf", "nan"])
def test_native_matches_torch_on_large_and_non_finite_inputs(
    monkeypatch: pytest.MonkeyPatch, name: str, n: int, kind: str
) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 3
    if kind == "halves":  # exact ties of round-half-to-even once scaled
        x = torch.randint(-254, 255, (n,), generator=g).float() / 2
    elif kind == "scaled":
        x[::5] *= 1e-30
        x[::7] = 0.0
        x[1::11] = -0.0
    elif kind == "tiny":  # absmax below 2**-64, some blocks subnormal: the rescaled comparison
        x[: n // 2] *= 1e-30
        x[n // 2 :] *= 1e-42
    elif kind == "inf":
        x[n // 2] = float("-inf")
    elif kind == "nan":
        x[n - 1] = float("nan")
    for block in (8, 1024):
        fast = _encode(monkeypatch, name, x, block, "1")
        assert fast == _encode(monkeypatch, name, x, block, "0")
        assert (fast == "rejected") == (kind in ("inf", "nan"))
        if isinstance(fast, Packet):
            codec = compression.make_codec(name, block=block)
            assert codec.decompress(fast).shape == x.shape


def test_native_ternary_uses_fresh_draws_per_call_like_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(4096, generator=torch.Generator().manual_seed(3))
    packets = {}
    for mode in ("1", "0"):
        monkeypatch.setenv(ENV_NATIVE, mode)
        codec = compression.make_codec("ternary", block=256, seed=9)
        packets[mode] = [codec.compress(x, key="g") for _ in range(3)]
    assert packets["1"] == packets["0"]
    assert packets["1"][0].buffers[0] != packets["1"][1].buffers[0]


def test_only_contiguous_float32_cpu_tensors_take_the_native_path() -> None:
    x = torch.randn(64, 64)
    assert native.encode_blockwise(x, 16, 8) is not None
    assert native.encode_blockwise(x.t(), 16, 8) is None  # not contiguous
    assert native.encode_blockwise(x.half(), 16, 8) is None
    assert native.encode_ternary(x[:1, :7], 8, 0) is None  # fewer than 8 elements
    with pytest.raises(ValueError):
        native.encode_blockwise(x, 16, 2)
    for bad_block in (0, 12, -8):
        with pytest.raises(ValueError):
            native.encode_ternary(x, bad_block, 0)


def test_a_failing_build_falls_back_to_torch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    x = torch.randn(3000, generator=torch.Generator().manual_seed(5))
    ref = {name: _encode(monkeypatch, name, x, 64, "0") for name in CODECS}
    monkeypatch.setenv(ENV_NATIVE, "1")
    monkeypatch.setenv(ENV_NATIVE_DIR, str(tmp_path / "cache"))  # nothing cached: must compile
    monkeypatch.setenv("CC", str(shutil.which("false")))  # a "compiler" that always fails
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_failed", False)
    with caplog.at_level(logging.WARNING, logger="compression.native"):
        assert not native.available()
        for name in CODECS:
            assert _encode(monkeypatch, name, x, 64, "1") == ref[name]
    assert "native codec kernel unavailable" in caplog.text


def test_the_build_is_cached_and_reused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ENV_NATIVE_DIR, str(tmp_path))
    native._build()
    built = sorted(tmp_path.iterdir())
    assert [p.suffix for p in built] == [".so"]

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("compiled again although the library is cached")

    monkeypatch.setattr(native.subprocess, "run", no_compiler)
    assert native._build().sw_encode is not None
    assert sorted(tmp_path.iterdir()) == built
