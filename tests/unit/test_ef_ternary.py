"""Issue 16, defect 3: error feedback around ternary must keep its residual bounded.

Plain TernGrad is unbiased but not a contraction (``E||C(x) - x||^2 / ||x||^2`` is about 1.4 for
Gaussian blocks of 256), so the EF residual grew to ~5.8x the input norm within 60 rounds. Inside error
feedback each block's scale is shrunk to ``sum x^2 / sum |x|`` (the variance-optimal ``1 / (1 + w)``
of its absmax), which makes the composition a contraction; the residual then stays below the input.
"""

from __future__ import annotations

import pytest
import torch

import compression
from compression import EF21, ErrorFeedback, TernaryCompressor, make_codec
from swarmtrain.core.config import CompressionConfig


def _residual_ratios(ef: ErrorFeedback, rounds: int, numel: int = 4096) -> list[float]:
    """``||residual|| / ||input||`` after each of ``rounds`` compressions of fresh Gaussian inputs."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(rounds):
        x = torch.randn(numel, generator=g)
        ef.compress(x, key="w")
        r = ef.residual("w")
        assert r is not None
        out.append(float(r.norm() / x.norm()))
    return out


def test_ef_residual_on_ternary_stays_bounded_over_many_rounds() -> None:
    ef = compression.build_compressor(CompressionConfig(codec="ternary", error_feedback="ef"))
    assert isinstance(ef, ErrorFeedback)
    ratios = _residual_ratios(ef, 300)
    # Before the fix: 5.84 after 60 rounds, 6.2 after 200. After: ~1.19, the stationary
    # sqrt((1 - d) / d) of a d-contraction with d = 1 / (1 + w) = 0.42 fed fresh inputs.
    assert ratios[59] < 1.5, ratios[59]
    assert max(ratios[60:]) < 1.5, max(ratios[60:])
    early, late = sum(ratios[40:100]) / 60, sum(ratios[240:300]) / 60
    assert late < 1.1 * early, (early, late)  # settled, not growing


@pytest.mark.parametrize(("codec", "before"), [("ternary", 1.43), ("topk+ternary", 0.83)])
def test_codec_inside_ef_is_a_contraction(codec: str, before: float) -> None:
    plain = make_codec(codec, fraction=0.1)
    inner = ErrorFeedback(plain).encoder
    assert inner.name == plain.name
    g = torch.Generator().manual_seed(5)
    errs = [0.0, 0.0]
    for _ in range(20):
        x = torch.randn(1000, generator=g)
        for j, c in enumerate((plain, inner)):
            errs[j] += float((c.decompress(c.compress(x)) - x).norm() ** 2 / x.norm() ** 2) / 20
    assert errs[0] == pytest.approx(before, abs=0.05)  # the codec outside EF is unchanged
    assert errs[1] < 0.75, errs  # ternary: w / (1 + w) = 0.58; topk+ternary: 0.72


def test_ef_ternary_is_a_contraction_and_sends_plain_ternary_packets() -> None:
    ef = ErrorFeedback(TernaryCompressor(256, seed=3))
    g = torch.Generator().manual_seed(5)
    errs = []
    for i in range(20):
        x = torch.randn(1000, generator=g) * (1 + i)  # 1000: a partial last block
        p = ef.compress(x, key=f"k{i}")  # fresh key: no residual, so the packet encodes x itself
        assert p.codec == "ternary"
        dec = make_codec("ternary").decompress(p)  # any peer's stock decoder reads it
        errs.append(float((dec - x).norm() ** 2 / x.norm() ** 2))
        r = ef.residual(f"k{i}")
        assert r is not None and torch.equal(r + dec.double(), x.double())  # EF stays exact
    assert sum(errs) / len(errs) < 0.75  # about w / (1 + w) = 0.58; plain ternary: 1.4


def test_ef21_and_plain_ternary_are_unchanged_elsewhere() -> None:
    plain = TernaryCompressor(256, seed=1)
    x = torch.randn(512, generator=torch.Generator().manual_seed(0))
    scale = torch.frombuffer(bytearray(plain.compress(x).buffers[1]), dtype=torch.float32)
    assert torch.equal(scale, x.view(2, 256).abs().amax(1))  # unbiased TernGrad outside EF
    ef21 = EF21(TernaryCompressor())
    assert isinstance(ef21.encoder, TernaryCompressor) and ef21.encoder.contractive
    assert isinstance(ef21.inner, TernaryCompressor) and not ef21.inner.contractive  # decodes, unbiased
