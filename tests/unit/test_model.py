"""The byte-level GPT: preset sizes, shapes, causality, deterministic initialisation."""

from __future__ import annotations

import math

import pytest
import torch

from swarmtrain.app.models import GPT, PRESETS, build_model, resolve_spec
from swarmtrain.core.config import ModelConfig
from swarmtrain.core.errors import ConfigError

SMALL = ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16)


def test_preset_sizes() -> None:
    counts = {name: spec.num_params() for name, spec in PRESETS.items()}
    assert 0.5e6 <= counts["tiny"] <= 3e6
    assert 10e6 <= counts["small"] <= 20e6
    assert 80e6 <= counts["gpt2-124m"] <= 130e6  # GPT-2 small's shape; byte vocab shrinks the embedding
    tiny = build_model(ModelConfig(preset="tiny"))
    assert tiny.num_params() == counts["tiny"]
    assert tiny.block_size == PRESETS["tiny"].block_size and tiny.vocab_size == 256


def test_forward_shapes_and_initial_loss() -> None:
    model = build_model(SMALL, seed=1)
    idx = torch.randint(0, 256, (3, 16))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 16, 256)
    assert loss is not None and loss.shape == ()
    assert abs(loss.item() - math.log(256)) < 0.5  # near-uniform predictions at init
    logits2, none = model(idx[:, :5])
    assert logits2.shape == (3, 5, 256) and none is None


def test_causal() -> None:
    model = build_model(SMALL, seed=0).eval()
    a = torch.randint(0, 256, (1, 16))
    b = a.clone()
    b[0, 10:] = (b[0, 10:] + 1) % 256
    la, _ = model(a)
    lb, _ = model(b)
    torch.testing.assert_close(la[0, :10], lb[0, :10])
    assert not torch.allclose(la[0, 10:], lb[0, 10:])


def test_deterministic_init_ignores_global_rng() -> None:
    torch.manual_seed(123)
    m1 = build_model(SMALL, seed=7)
    torch.manual_seed(999)
    torch.rand(1000)
    m2 = build_model(SMALL, seed=7)
    m3 = build_model(SMALL, seed=8)
    for (n, p1), p2, p3 in zip(m1.named_parameters(), m2.parameters(), m3.parameters(), strict=True):
        assert torch.equal(p1, p2), n
        if p1.dim() >= 2:
            assert not torch.equal(p1, p3), n


def test_tied_head() -> None:
    m = build_model(SMALL)
    assert m.lm_head.weight is m.wte.weight
    assert len(list(m.parameters())) == len({id(p) for p in m.parameters()})


def test_bad_inputs_raise_typed_errors() -> None:
    m = build_model(SMALL)
    with pytest.raises(ConfigError, match="block_size"):
        m(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ConfigError, match="batch, time"):
        m(torch.zeros(16, dtype=torch.long))
    with pytest.raises(ConfigError, match="divisible"):
        resolve_spec(ModelConfig(n_embd=30, n_head=4))
    with pytest.raises(ConfigError, match="vocab"):
        resolve_spec(ModelConfig(vocab_size=100), vocab_size=300)


def test_vocab_follows_data() -> None:
    spec = resolve_spec(ModelConfig(), vocab_size=1000)
    assert spec.vocab_size == 1000
    assert isinstance(GPT(spec), GPT)
