"""TernGrad is unbiased: the mean of many independent decodes converges to the input."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compression
from compression.ternary import hash_uniform


@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.integers(1, 300), st.integers(0, 2**31), st.sampled_from([8, 64]))
def test_mean_of_decodes_converges_to_the_input(n: int, seed: int, block: int) -> None:
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal(n).astype(np.float32))
    codec = compression.TernaryCompressor(block, seed=seed)
    draws = 400
    total = torch.zeros(n, dtype=torch.float64)
    for _ in range(draws):
        total += codec.decompress(codec.compress(x, key="g")).double()
    mean = total / draws
    # Each draw is s * Bernoulli(|x| / s) * sign(x): std per element <= s / 2. Allow 5 sigma.
    s = torch.from_numpy(np.abs(x.numpy())).double()
    pad = (-n) % block
    am = torch.cat([s, torch.zeros(pad, dtype=torch.float64)]).reshape(-1, block).amax(1, keepdim=True)
    am = am.expand(-1, block).reshape(-1)[:n]
    sigma = torch.sqrt(s * (am - s) / draws)
    assert bool(((mean - x.double()).abs() <= 5 * sigma + 1e-6 * am).all())


def test_bias_is_far_below_the_noise_on_a_large_tensor() -> None:
    """Aggregate check: the mean error over 200k elements is ~0, while a biased rounding is not."""
    torch.manual_seed(0)
    x = torch.rand(200_000) * 0.5 + 0.25  # all positive: any bias would show up in the mean
    codec = compression.TernaryCompressor(256, seed=7)
    y = codec.decompress(codec.compress(x))
    am = float(x.abs().max())
    err = float((y - x).double().mean())
    noise = float(torch.sqrt((x * (am - x)).double().mean() / x.numel()))
    assert abs(err) < 5 * noise
    # Baseline: deterministic rounding to the nearest of {0, am} is visibly biased on this input.
    nearest = torch.where(x > am / 2, am, 0.0)
    assert abs(float((nearest - x).double().mean())) > 50 * noise


def test_tiny_blocks_stay_unbiased() -> None:
    """Blocks whose absmax is subnormal: ``u * s`` would lose its precision without the 2**64 rescale."""
    x = torch.full((4096,), 3e-43)  # subnormal float32 (the representable value nearest 3e-43)
    x[::2] = 1e-42  # the block absmax
    codec = compression.TernaryCompressor(64, seed=1)
    total = torch.zeros_like(x, dtype=torch.float64)
    for _ in range(50):
        total += codec.decompress(codec.compress(x, key="t")).double()
    kept = float((total[1::2] / 50 / 1e-42).mean())  # fraction of draws that kept the small values
    want = float(x[1]) / float(x[0])
    assert abs(kept - want) < 0.02, (kept, want)
    assert bool((total[::2] / 50 == float(x[0])).all())  # the absmax itself is always kept


def test_hash_draws_are_uniform_and_device_free() -> None:
    idx = torch.arange(1 << 16)
    u = hash_uniform(idx, torch.tensor(12345))
    assert float(u.min()) > 0 and float(u.max()) < 1
    hist = torch.histc(u, bins=16, min=0, max=1)
    expected = idx.numel() / 16
    assert float(((hist - expected) ** 2 / expected).sum()) < 40  # chi^2, 15 dof: p ~ 5e-4
    assert torch.equal(u, hash_uniform(idx, torch.tensor(12345)))
    v = hash_uniform(idx, torch.tensor(54321))
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 0.02


def test_int32_hash_lanes_give_the_int64_reference_draws() -> None:
    """The encoder's int32 mixer wraps modulo 2**32 exactly like the int64 reference."""
    from compression.ternary import _as_int32, _hash_uniform32

    idx = torch.randint(0, 2**31 - 1, (1 << 16,), generator=torch.Generator().manual_seed(3))
    for base in (0, 2**31 - 1, 2**31, 2**32 - 1, 2**32 + 5, 123_456_789):
        ref = hash_uniform(idx, torch.tensor(base))
        lanes = _hash_uniform32(idx.int(), torch.tensor(_as_int32(base), dtype=torch.int32))
        assert torch.equal(ref, lanes), base
