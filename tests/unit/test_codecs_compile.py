"""Compiled (torch.compile) and eager codec kernels produce identical packets and decodes, so
determinism never depends on which path ran; a failing compile falls back to eager."""

from __future__ import annotations

import logging

import pytest
import torch

import compression
from compression.kernels import ENV_COMPILE, ENV_MIN_NUMEL, Kernel, compile_mode, min_numel
from compression.native import ENV_NATIVE

N = 3 * 1024 + 77  # three full blocks of 1024 and a short tail


def _both_paths(
    monkeypatch: pytest.MonkeyPatch, name: str, dtype: torch.dtype
) -> tuple[tuple[object, torch.Tensor], tuple[object, torch.Tensor]]:
    x = (torch.randn(N, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    out = []
    monkeypatch.setenv(ENV_NATIVE, "0")  # torch.compile vs eager torch (test_codecs_native covers C)
    for mode in ("0", "1"):
        monkeypatch.setenv(ENV_COMPILE, mode)
        codec = compression.make_codec(name, block=1024, seed=5)
        p = codec.compress(x, key="w")
        out.append((p, codec.decompress(p)))
    return out[0], out[1]


@pytest.mark.parametrize("name", ["int8", "ternary"])
def test_compiled_encoder_matches_eager_bit_for_bit(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    (pe, de), (pc, dc) = _both_paths(monkeypatch, name, torch.float32)
    assert pc == pe
    assert torch.equal(dc, de)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["int8", "int4", "ternary"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_compiled_paths_match_eager_for_every_dtype(
    monkeypatch: pytest.MonkeyPatch, name: str, dtype: torch.dtype
) -> None:
    (pe, de), (pc, dc) = _both_paths(monkeypatch, name, dtype)
    assert pc == pe
    assert torch.equal(dc, de)


def test_mode_and_threshold_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    k = Kernel(lambda x: x + 1, "plus-one")
    monkeypatch.setenv(ENV_COMPILE, "0")
    assert compile_mode() == "off" and not k.use_compiled(1 << 30)
    monkeypatch.setenv(ENV_COMPILE, "1")
    assert compile_mode() == "always" and k.use_compiled(1)
    monkeypatch.delenv(ENV_COMPILE)
    monkeypatch.setenv(ENV_MIN_NUMEL, "1000")
    assert compile_mode() == "auto" and min_numel() == 1000
    assert k.use_compiled(1000) and not k.use_compiled(999)


def test_a_failing_compile_falls_back_to_eager(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def needs_python(x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):  # data-dependent branch: fullgraph compilation refuses it
            return x * 4
        return x

    k = Kernel(needs_python, "graph-break")
    monkeypatch.setenv(ENV_COMPILE, "1")
    x = torch.ones(4)
    with caplog.at_level(logging.WARNING, logger="compression.kernels"):
        assert torch.equal(k(x, numel=4), x * 4)
    assert "using eager torch" in caplog.text
    assert not k.use_compiled(1 << 30)
