"""Error feedback: ``residual + decoded == input`` exactly, state round trips, EF21 tracks its input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compression
from swarmtrain.core.errors import ConfigError

NAMES = ["int8", "int4", "ternary", "topk", "topk+int8", "topk+ternary", "fp16", "bf16"]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    st.sampled_from(NAMES),
    st.integers(1, 400),
    st.integers(0, 2**31),
    st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_residual_plus_decoded_equals_input_exactly(name: str, n: int, seed: int, dtype: torch.dtype) -> None:
    rng = np.random.default_rng(seed)
    ef = compression.ErrorFeedback(compression.make_codec(name, block=8, fraction=0.2, seed=seed))
    for step in range(4):
        scale = 10.0 ** rng.integers(-8, 3)  # fp16 saturates at 65504
        t = torch.from_numpy((rng.standard_normal(n) * scale).astype(np.float32)).to(dtype)
        old = ef.residual("w")
        corrected = (t.double() + (old if old is not None else 0.0)).to(dtype)
        p = ef.compress(t, key="w")
        decoded = ef.decompress(p)
        r = ef.residual("w")
        assert r is not None and r.dtype == torch.float64
        assert torch.equal(r + decoded.double(), corrected.double()), (name, step)


def test_error_feedback_loses_nothing_over_time() -> None:
    """Sum of what was sent + final residual == sum of inputs (up to the float32 rounding of each
    corrected input); without error feedback the dropped mass accumulates."""
    torch.manual_seed(0)
    inputs = [torch.randn(2000) for _ in range(30)]
    ef = compression.ErrorFeedback(compression.TopKCompressor(fraction=0.05))
    plain = compression.TopKCompressor(fraction=0.05)
    sent_ef = torch.zeros(2000, dtype=torch.float64)
    sent_plain = torch.zeros(2000, dtype=torch.float64)
    for t in inputs:
        sent_ef += ef.decompress(ef.compress(t, key="g")).double()
        sent_plain += plain.decompress(plain.compress(t)).double()
    total = torch.stack(inputs).double().sum(0)
    residual = ef.residual("g")
    assert residual is not None
    torch.testing.assert_close(sent_ef + residual, total, rtol=0, atol=1e-4)
    assert float((sent_ef - total).norm()) < 0.5 * float((sent_plain - total).norm())


def test_state_dict_round_trip_reproduces_the_next_packet() -> None:
    a = compression.ErrorFeedback(compression.TernaryCompressor(16, seed=4))
    for _ in range(3):
        a.compress(torch.randn(100), key="x")
        a.compress(torch.randn(7, 3), key="y")
    b = compression.ErrorFeedback(compression.TernaryCompressor(16, seed=0))
    b.load_state_dict(a.state_dict())
    t = torch.randn(100)
    assert a.compress(t, key="x") == b.compress(t, key="x")
    with pytest.raises(ConfigError):
        a.compress(torch.randn(5), key="x")  # same key, other shape
    with pytest.raises(ConfigError):
        b.load_state_dict({"memory": {"x": [1, 2]}})


def test_ef21_estimate_tracks_a_fixed_input() -> None:
    torch.manual_seed(0)
    t = torch.randn(1000)
    ef21 = compression.EF21(compression.TopKCompressor(fraction=0.1))
    assert ef21.sends_increments
    errors = []
    for _ in range(12):
        old = ef21.estimate("g")
        inc = ef21.decompress(ef21.compress(t, key="g"))
        g = ef21.estimate("g")
        assert g is not None
        assert torch.equal(g, (old if old is not None else torch.zeros(1000)) + inc)
        errors.append(float((t - g).norm()))
    # top-10% is a contraction: the error never grows and ends far below the start.
    assert all(b <= a for a, b in zip(errors, errors[1:], strict=False))
    assert errors[-1] < 0.05 * float(t.norm())
    state = ef21.state_dict()
    other = compression.EF21(compression.TopKCompressor(fraction=0.1))
    other.load_state_dict(state)
    assert torch.equal(other.estimate("g"), ef21.estimate("g"))


def test_wrappers_do_not_nest() -> None:
    with pytest.raises(ConfigError):
        compression.EF21(compression.ErrorFeedback(compression.Int8Compressor()))
