"""The byte-level GPT cut into contiguous pipeline stages (SWARM parallelism, Ryabinin et al. 2023).

Stage 0 holds the token and position embeddings and the first blocks; the last stage holds the last
blocks, the final LayerNorm, the output head and the loss; stages in between hold blocks only. The
head is *untied* from the embedding: the two live on different peers, and keeping them tied would
need an all-reduce of the shared weight across stages after every step. :func:`split_gpt` copies a
full :class:`GPT`'s parameters (the head gets a copy of the embedding), so at the split the stages
compute exactly what the tied model computes; from then on they train as the untied model, which
is what the single-process baseline (:func:`compose`) trains too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from swarmtrain.app.models.gpt import GPT, Block
from swarmtrain.app.models.presets import GPTSpec
from swarmtrain.core.errors import ConfigError

__all__ = ["GPTStage", "stage_blocks", "split_gpt", "build_stages", "pipeline_loss"]


def stage_blocks(n_layer: int, stages: int) -> list[range]:
    """Contiguous block ranges of ``stages`` stages, as equal as possible (earlier stages get the
    remainder).

    Raises:
        ConfigError: fewer than 2 stages, or more stages than blocks.
    """
    if stages < 2:
        raise ConfigError(f"swarm.stages must be >= 2, got {stages}")
    if stages > n_layer:
        raise ConfigError(f"swarm.stages={stages} exceeds the model's {n_layer} blocks")
    base, extra = divmod(n_layer, stages)
    out, start = [], 0
    for i in range(stages):
        n = base + (1 if i < extra else 0)
        out.append(range(start, start + n))
        start += n
    return out


class GPTStage(nn.Module):
    """One contiguous slice of the GPT.

    Args:
        spec: the whole model's architecture.
        index: this stage's index in ``[0, stages)``.
        stages: number of stages.
        blocks: the global indices of the blocks this stage holds.
    """

    def __init__(self, spec: GPTSpec, index: int, stages: int, blocks: range) -> None:
        super().__init__()
        if not 0 <= index < stages:
            raise ConfigError(f"stage {index} is outside [0, {stages})")
        self.spec = spec
        self.index = index
        self.stages = stages
        self.first = index == 0
        self.last = index == stages - 1
        self.block_range = blocks
        if self.first:
            self.wte = nn.Embedding(spec.vocab_size, spec.n_embd)
            self.wpe = nn.Embedding(spec.block_size, spec.n_embd)
            self.drop = nn.Dropout(spec.dropout)
        self.blocks = nn.ModuleList(Block(spec) for _ in blocks)
        if self.last:
            self.ln_f = nn.LayerNorm(spec.n_embd)
            self.lm_head = nn.Linear(spec.n_embd, spec.vocab_size, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Run this stage.

        Args:
            x: ``[B, T]`` int64 token ids on stage 0, else ``[B, T, C]`` hidden states.
            targets: ``[B, T]`` next-token ids; on the last stage only.

        Returns:
            ``[B, T, C]`` hidden states; on the last stage the mean cross-entropy with ``targets``
            (a scalar), or the ``[B, T, V]`` logits without them.
        """
        if self.first:
            pos = torch.arange(x.size(1), device=x.device)
            x = self.drop(self.wte(x) + self.wpe(pos))  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        if not self.last:
            return x
        logits = self.lm_head(self.ln_f(x))  # [B, T, V]
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


@torch.no_grad()
def split_gpt(model: GPT, stages: int) -> list[GPTStage]:
    """Cut ``model`` into ``stages`` stages holding copies of its parameters (head untied)."""
    ranges = stage_blocks(model.spec.n_layer, stages)
    out = []
    for i, r in enumerate(ranges):
        st = GPTStage(model.spec, i, stages, r)
        if st.first:
            st.wte.weight.copy_(model.wte.weight)
            st.wpe.weight.copy_(model.wpe.weight)
        for j, g in enumerate(r):
            st.blocks[j].load_state_dict(model.blocks[g].state_dict())
        if st.last:
            st.ln_f.load_state_dict(model.ln_f.state_dict())
            st.lm_head.weight.copy_(model.lm_head.weight)  # the tied embedding, now a copy
        out.append(st)
    return out


def build_stages(spec: GPTSpec, stages: int, seed: int = 0) -> list[GPTStage]:
    """All stages of the GPT ``spec`` initialised from ``seed`` (every peer gets the same bits)."""
    return split_gpt(GPT(spec, seed=seed), stages)


def pipeline_loss(stages: list[GPTStage], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss of the stages composed in one process (the single-process reference)."""
    h = x
    for st in stages[:-1]:
        h = st(h)
    return stages[-1](h, y)
