"""The memory budget's arithmetic against figures computed by hand
(``swarmtrain.app.train.memory_budget``)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from swarmtrain.app.models import build_model
from swarmtrain.app.models.presets import PRESETS, GPTSpec
from swarmtrain.app.train.memory_budget import (
    BLOCK,
    activation_bytes,
    format_budget,
    largest_fitting_preset,
    memory_budget,
    param_shapes,
)
from swarmtrain.core.config import Config, load_config

N_TINY = 842_496  # tiny preset: 256*128 + 128*128 + 4*(12*128^2 + 13*128) + 2*128


def _cfg(**overrides: Any) -> Config:
    return load_config(env={}, overrides={"model.preset": "tiny", **overrides})


def _by_name(budget: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in budget.components:
        out[c.name] = out.get(c.name, 0) + c.total_bytes
    return out


def test_param_shapes_match_the_real_model() -> None:
    assert sum(math.prod(s) for s in param_shapes(PRESETS["tiny"])) == N_TINY
    for spec in PRESETS.values():
        assert sum(math.prod(s) for s in param_shapes(spec)) == spec.num_params()
    model = build_model(_cfg().model, seed=0)
    assert sorted(p.numel() for p in model.parameters()) == sorted(
        math.prod(s) for s in param_shapes(PRESETS["tiny"])
    )


def test_local_adamw_fp32_is_16_bytes_per_param_plus_activations() -> None:
    b = memory_budget(_cfg(), "cuda")
    parts = _by_name(b)
    assert parts["weights"] == 4 * N_TINY
    assert parts["grads"] == 4 * N_TINY
    assert parts["inner states"] == 8 * N_TINY
    assert {"outer state", "residuals", "buffers"}.isdisjoint(parts)
    # bf16 autocast on CUDA: activations by the rule plus 2 B/param of cached bf16 weights
    spec = PRESETS["tiny"]
    d, t, v, layers, batch = 128, 128, 256, 4, 16
    per_token = layers * (2 * d * 4 + 14 * d * 2) + 4 * d + 2 * d + v * (2 + 8) + 4 * d
    assert activation_bytes(spec, batch, bf16=True) == batch * t * per_token
    assert parts["activations"] == batch * t * per_token + 2 * N_TINY
    assert b.peak_bytes("device") == 16 * N_TINY + parts["activations"]
    assert b.peak_bytes("host") == 0


def test_diloco_outer_state_and_buffers_on_the_device() -> None:
    cfg = _cfg(**{"strategy.name": "diloco", "compression.codec": "int8", "train.bf16": "off"})
    b = memory_budget(cfg, "cuda")
    parts = _by_name(b)
    assert parts["outer state"] == 8 * N_TINY  # fp32 anchor + fp32 momentum
    dev_buf = sum(c.total_bytes for c in b.components if c.name == "buffers" and c.where == "device")
    host_buf = sum(c.total_bytes for c in b.components if c.name == "buffers" and c.where == "host")
    assert dev_buf == 8 * N_TINY  # flat copy + pseudo-gradient
    assert host_buf == 4 * N_TINY + int(N_TINY * (8 + 32 / BLOCK) / 8)  # fp32 result + int8 packets
    acts = activation_bytes(PRESETS["tiny"], 16, bf16=False)
    assert b.peak_bytes("device") == 24 * N_TINY + max(acts, 8 * N_TINY)
    assert b.peak_bytes("host") == host_buf


def test_cpu_device_sums_both_sides() -> None:
    cfg = _cfg(**{"strategy.name": "diloco"})
    b = memory_budget(cfg, "cpu")
    assert all(c.where == "host" for c in b.components)
    acts = activation_bytes(PRESETS["tiny"], 16, bf16=False)
    sync = 8 * N_TINY + 4 * N_TINY + 4 * N_TINY  # flat + pseudo + result + fp32 packets
    assert b.total_peak_bytes() == 24 * N_TINY + max(acts, sync)


def test_error_feedback_residuals_and_sgd() -> None:
    ef = _by_name(
        memory_budget(_cfg(**{"strategy.name": "data_parallel", "compression.error_feedback": "ef"}))
    )
    assert ef["residuals"] == 12 * N_TINY  # float64: each element sent, and an owner's partition (<= 1/2)
    ef21 = _by_name(
        memory_budget(_cfg(**{"strategy.name": "data_parallel", "compression.error_feedback": "ef21"}))
    )
    assert ef21["residuals"] == 6 * N_TINY
    sgd = _by_name(memory_budget(_cfg(**{"train.optimizer": "sgd"})))
    assert sgd["inner states"] == 4 * N_TINY


def test_demo_has_its_momentum_and_no_inner_state() -> None:
    parts = _by_name(memory_budget(_cfg(**{"strategy.name": "demo"})))
    assert "inner states" not in parts and "outer state" not in parts
    assert parts["residuals"] == 4 * N_TINY
    assert parts["buffers"] == 2 * 4 * (4 * 128 * 128)  # DCT of the largest tensor: the MLP 4d x d


def test_streaming_buffers_are_one_fragment() -> None:
    cfg = _cfg(**{"strategy.name": "streaming_diloco", "strategy.fragments": 4})
    parts = _by_name(memory_budget(cfg, "cuda"))
    sent = N_TINY // 4
    assert parts["outer state"] == 8 * N_TINY  # the whole anchor and momentum are kept
    assert parts["buffers"] == 8 * sent + 4 * sent + 4 * sent


def _patched(cfg: Config, optimizer: str | None = None, outer_state: str | None = None) -> Any:
    """``cfg`` with fields the config may not have yet (adamw8bit, outer_state), set without validation."""
    train = cfg.train.model_construct(
        **{**cfg.train.model_dump(), **({"optimizer": optimizer} if optimizer else {})}
    )
    strategy = cfg.strategy
    if outer_state is not None:
        strategy = type(cfg.strategy).model_construct(
            **{**cfg.strategy.model_dump(), "outer_state": outer_state}
        )
    return cfg.model_construct(**{**dict(cfg), "train": train, "strategy": strategy})


def test_adamw8bit_counts_small_tensors_at_32_bits() -> None:
    cfg = _patched(_cfg(), optimizer="adamw8bit")
    parts = _by_name(memory_budget(cfg, "cuda"))
    d = 128
    vectors = 4 * 13 * d + 2 * d  # LayerNorms and biases (13d per block, ln_f): all < 4096 -> fp32 states
    matrices = [256 * d, 128 * d] + 4 * [3 * d * d, d * d, 4 * d * d, 4 * d * d]  # wte, wpe, blocks
    assert vectors + sum(matrices) == N_TINY
    expected = 8 * vectors + sum(2 * m + 2 * 4 * (m // 256) for m in matrices)  # every m is a multiple of 256
    assert parts["inner states"] == expected
    assert 2.0 < expected / N_TINY < 2.1


@pytest.mark.parametrize(("placement", "host_outer"), [("cpu", 8 * N_TINY), ("cpu8", 5 * N_TINY)])
def test_offloaded_outer_state_moves_to_the_host(placement: str, host_outer: int) -> None:
    cfg = _patched(_cfg(**{"strategy.name": "diloco"}), outer_state=placement)
    b = memory_budget(cfg, "cuda")
    outer = [c for c in b.components if c.name == "outer state"]
    assert [c.where for c in outer] == ["host"]
    expected = host_outer if placement == "cpu" else 4 * N_TINY + N_TINY + 4 * math.ceil(N_TINY / 256)
    assert outer[0].total_bytes == expected
    # the pseudo-gradient and its flat copy are still built on the device (optimizers.outer_store)
    assert sum(c.total_bytes for c in b.components if c.where == "device" and c.phase == "sync") == 8 * N_TINY


def test_largest_fitting_preset_and_table_width() -> None:
    cfg = _cfg(**{"strategy.name": "diloco"})
    assert largest_fitting_preset(cfg, "cuda", free_device=1 << 50) == "gpt2-124m"
    assert largest_fitting_preset(cfg, "cuda", free_device=1 << 10) is None
    tiny_peak = memory_budget(cfg, "cuda").peak_bytes("device")
    assert largest_fitting_preset(cfg, "cuda", free_device=tiny_peak) == "tiny"
    text = format_budget(memory_budget(cfg, "cuda"), "tiny", 1 << 30)
    assert all(len(line) < 80 for line in text.splitlines())
    assert "largest preset that fits: tiny" in text


def test_spec_override_changes_the_count() -> None:
    spec = GPTSpec(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16)
    b = memory_budget(_cfg(), "cpu", spec=spec)
    assert b.num_params == spec.num_params() == 16 * 8 + 8 * 8 + 12 * 64 + 13 * 8 + 16
