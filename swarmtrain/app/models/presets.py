"""Named sizes of the byte-level GPT (shapes follow GPT-2, Radford et al. 2019, with a 256-byte vocab)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from swarmtrain.core.config import ModelConfig
from swarmtrain.core.errors import ConfigError

__all__ = ["GPTSpec", "PRESETS", "BYTE_VOCAB", "resolve_spec"]

BYTE_VOCAB = 256


@dataclass(frozen=True)
class GPTSpec:
    """The exact architecture of one GPT.

    Attributes:
        n_layer: transformer blocks.
        n_head: attention heads per block (``n_embd`` must divide evenly).
        n_embd: residual stream width.
        block_size: context length in tokens.
        vocab_size: token ids are ``[0, vocab_size)``; 256 for raw bytes.
        dropout: dropout probability on attention, residual and embedding outputs.
    """

    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int = BYTE_VOCAB
    dropout: float = 0.0

    def num_params(self) -> int:
        """Parameter count (embedding tied to the output head; counts position embeddings)."""
        d = self.n_embd
        per_block = 12 * d * d + 13 * d  # qkv+proj+mlp weights and biases, two LayerNorms
        return self.vocab_size * d + self.block_size * d + self.n_layer * per_block + 2 * d


# tiny: ~0.8M params, 4 peers train it together on 2 CPU cores in minutes.
# small: ~10.8M params. gpt2-124m: GPT-2 small's shape (~86M params with a byte vocab).
PRESETS: dict[str, GPTSpec] = {
    "tiny": GPTSpec(n_layer=4, n_head=4, n_embd=128, block_size=128),
    "small": GPTSpec(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "gpt2-124m": GPTSpec(n_layer=12, n_head=12, n_embd=768, block_size=1024),
}


def resolve_spec(cfg: ModelConfig, vocab_size: int | None = None) -> GPTSpec:
    """The preset named by ``cfg`` with its explicit overrides applied.

    Args:
        cfg: model section of the run config.
        vocab_size: vocab the data needs (used when ``cfg.vocab_size`` is unset).

    Raises:
        ConfigError: unknown preset, heads not dividing the width, or a vocab too small for the data.
    """
    if cfg.preset not in PRESETS:
        raise ConfigError(f"model.preset: unknown preset {cfg.preset!r}; choose one of: {sorted(PRESETS)}")
    spec = PRESETS[cfg.preset]
    vocab = cfg.vocab_size if cfg.vocab_size is not None else (vocab_size or spec.vocab_size)
    if vocab_size is not None and vocab < vocab_size:
        raise ConfigError(f"model.vocab_size: {vocab} is smaller than the data's vocab {vocab_size}")
    spec = replace(
        spec,
        n_layer=cfg.n_layer if cfg.n_layer is not None else spec.n_layer,
        n_head=cfg.n_head if cfg.n_head is not None else spec.n_head,
        n_embd=cfg.n_embd if cfg.n_embd is not None else spec.n_embd,
        block_size=cfg.block_size if cfg.block_size is not None else spec.block_size,
        vocab_size=vocab,
        dropout=cfg.dropout,
    )
    if spec.n_embd % spec.n_head:
        raise ConfigError(f"model: n_embd={spec.n_embd} is not divisible by n_head={spec.n_head}")
    return spec
