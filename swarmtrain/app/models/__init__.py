"""Byte-level GPT models and their named presets (``tiny``, ``small``, ``gpt2-124m``)."""

from __future__ import annotations

from swarmtrain.app.models.gpt import GPT, MLP, Block, CausalSelfAttention
from swarmtrain.app.models.presets import BYTE_VOCAB, PRESETS, GPTSpec, resolve_spec
from swarmtrain.core.config import ModelConfig

__all__ = [
    "GPT",
    "GPTSpec",
    "PRESETS",
    "BYTE_VOCAB",
    "Block",
    "CausalSelfAttention",
    "MLP",
    "build_model",
    "resolve_spec",
]


def build_model(cfg: ModelConfig, *, seed: int = 0, vocab_size: int | None = None) -> GPT:
    """Build the GPT described by ``cfg``, initialised deterministically from ``seed``.

    Args:
        cfg: model section of the run config (preset plus overrides).
        seed: initialisation seed; equal seeds give bit-identical parameters on every machine.
        vocab_size: the data's vocab (token files); ``None`` for bytes.

    Raises:
        ConfigError: an inconsistent architecture.
    """
    return GPT(resolve_spec(cfg, vocab_size=vocab_size), seed=seed)
