"""A byte-level decoder-only transformer (GPT-2 architecture, Radford et al. 2019; nanoGPT layout).

Pre-LayerNorm blocks, causal ``scaled_dot_product_attention``, GELU MLP, learned positions, and an
output head tied to the token embedding. Initialisation draws from a private ``torch.Generator``
seeded by the caller, so every peer that builds the model from the same seed starts from
bit-identical parameters whatever its global RNG state.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from swarmtrain.app.models.presets import GPTSpec
from swarmtrain.core.errors import ConfigError

__all__ = ["GPT", "Block", "CausalSelfAttention", "MLP"]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection."""

    def __init__(self, spec: GPTSpec) -> None:
        super().__init__()
        self.n_head = spec.n_head
        self.n_embd = spec.n_embd
        self.dropout = spec.dropout
        self.c_attn = nn.Linear(spec.n_embd, 3 * spec.n_embd)
        self.c_proj = nn.Linear(spec.n_embd, spec.n_embd)
        self.resid_drop = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # [B, T, C]
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hd = c // self.n_head
        # [B, T, C] -> [B, H, T, hd]
        q = q.view(b, t, self.n_head, hd).transpose(1, 2)
        k = k.view(b, t, self.n_head, hd).transpose(1, 2)
        v = v.view(b, t, self.n_head, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.c_proj(y))


class MLP(nn.Module):
    """Position-wise feed-forward: ``C -> 4C -> GELU -> C``."""

    def __init__(self, spec: GPTSpec) -> None:
        super().__init__()
        self.c_fc = nn.Linear(spec.n_embd, 4 * spec.n_embd)
        self.c_proj = nn.Linear(4 * spec.n_embd, spec.n_embd)
        self.drop = nn.Dropout(spec.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One pre-LN transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``."""

    def __init__(self, spec: GPTSpec) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(spec.n_embd)
        self.attn = CausalSelfAttention(spec)
        self.ln_2 = nn.LayerNorm(spec.n_embd)
        self.mlp = MLP(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only transformer over a small vocabulary (256 bytes by default).

    Args:
        spec: the architecture.
        seed: seed of the private generator used for initialisation.
    """

    def __init__(self, spec: GPTSpec, seed: int = 0) -> None:
        super().__init__()
        self.spec = spec
        self.block_size = spec.block_size
        self.vocab_size = spec.vocab_size
        self.wte = nn.Embedding(spec.vocab_size, spec.n_embd)
        self.wpe = nn.Embedding(spec.block_size, spec.n_embd)
        self.drop = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.n_layer))
        self.ln_f = nn.LayerNorm(spec.n_embd)
        self.lm_head = nn.Linear(spec.n_embd, spec.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf 2017)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """GPT-2 init from a private generator: N(0, 0.02), residual projections scaled by depth."""
        g = torch.Generator(device="cpu").manual_seed(int(seed))
        resid_std = 0.02 / math.sqrt(2 * self.spec.n_layer)
        for name, p in self.named_parameters():  # deterministic order; tied weight appears once
            if name.endswith("bias"):
                p.zero_()
            elif ".ln_" in name or name.startswith("ln_"):
                p.fill_(1.0)
            else:
                std = resid_std if name.endswith("c_proj.weight") else 0.02
                p.copy_(torch.randn(p.shape, generator=g) * std)

    def num_params(self) -> int:
        """Number of distinct parameters (the tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position, and the mean cross-entropy when ``targets`` is given.

        Args:
            idx: ``[B, T]`` int64 token ids, ``T <= block_size``.
            targets: ``[B, T]`` int64 next-token ids, or ``None``.

        Returns:
            ``(logits [B, T, vocab], loss or None)``.

        Raises:
            ConfigError: the sequence is longer than the context or not 2-D.
        """
        if idx.dim() != 2:
            raise ConfigError(f"GPT input must be [batch, time], got shape {tuple(idx.shape)}")
        t = idx.size(1)
        if t > self.block_size:
            raise ConfigError(f"sequence length {t} exceeds the model's block_size {self.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # [B, T, V]
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss
