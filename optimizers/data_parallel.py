"""``DataParallel``: all-reduce the gradients every step, then step the inner optimizer.

The synchronous baseline every comparison needs (what DDP does): each peer computes gradients on its
own batch, the group averages them weighted by tokens, and every peer applies the same averaged
gradient with its own copy of the inner optimizer, so replicas stay identical.

Gradients are flattened into a few fp32 buckets (``bucket_numel`` elements each) so that a round
carries a handful of large tensors rather than one small tensor per parameter.

A round that does not commit skips the optimizer step (the model and the optimizer are left exactly
as they were): applying only the local gradient would make this replica drift from the others.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from optimizers.base import (
    STRATEGIES,
    StrategyContext,
    compressor_state,
    load_compressor_state,
    make_compressor,
    options_of,
    reduce_or_rollback,
    require_collective,
    round_report,
    trainable_parameters,
)
from swarmtrain.core.config import DataParallelConfig
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import StepReport

__all__ = ["DataParallel", "flatten_buckets", "unflatten_buckets"]

DEFAULT_BUCKET_NUMEL = 1 << 22  # 4M fp32 elements = 16 MiB per bucket


def flatten_buckets(
    tensors: list[torch.Tensor], bucket_numel: int
) -> tuple[dict[str, torch.Tensor], list[tuple[int, int, int]]]:
    """Pack tensors into fp32 buckets of at most ``bucket_numel`` elements (a larger tensor gets its own).

    Returns:
        ``{"bucket<i>": flat}`` and, per input tensor, ``(bucket index, offset, numel)``.
    """
    layout: list[tuple[int, int, int]] = []
    groups: list[list[torch.Tensor]] = [[]]
    fill = 0
    for t in tensors:
        n = t.numel()
        if fill and fill + n > bucket_numel:
            groups.append([])
            fill = 0
        layout.append((len(groups) - 1, fill, n))
        groups[-1].append(t.detach().reshape(-1).to(torch.float32))
        fill += n
    buckets = {f"bucket{i}": torch.cat(g) if g else torch.zeros(0) for i, g in enumerate(groups)}
    return buckets, layout


def unflatten_buckets(
    buckets: Mapping[str, torch.Tensor], layout: list[tuple[int, int, int]], like: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Inverse of ``flatten_buckets``: views shaped (and typed) like ``like``."""
    out = []
    for (b, off, n), ref in zip(layout, like, strict=True):
        out.append(buckets[f"bucket{b}"][off : off + n].reshape(ref.shape).to(ref.dtype))
    return out


@STRATEGIES.register("data_parallel")
class DataParallel:
    """Gradient all-reduce every step (the baseline).

    Args:
        ctx: model, inner optimizer, configs (``ctx.config`` a ``DataParallelConfig``) and the
            collective (required).
        bucket_numel: elements per gradient bucket.

    Raises:
        ConfigError: without a collective, or with another strategy's options.
    """

    name = "data_parallel"

    def __init__(self, ctx: StrategyContext, bucket_numel: int = DEFAULT_BUCKET_NUMEL) -> None:
        self.ctx = ctx
        self.config = options_of(ctx, DataParallelConfig)
        self.collective = require_collective(ctx, self.name)
        if bucket_numel < 1:
            raise ConfigError(f"bucket_numel must be >= 1, got {bucket_numel}")
        self.compressor = make_compressor(ctx)
        self.params = list(trainable_parameters(ctx.model).values())
        self.bucket_numel = bucket_numel
        self.steps = 0
        self.failed_rounds = 0

    @torch.no_grad()
    def step(self, tokens: int) -> StepReport:
        """Average gradients across peers (weight = ``tokens``), then ``optimizer.step()``.

        ``extra["comm_wait_s"]``: seconds spent inside the blocking all-reduce.
        """
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        buckets, layout = flatten_buckets(grads, self.bucket_numel)
        t0 = time.perf_counter()
        res = reduce_or_rollback(  # a failed round's gradient is dropped, so is its residual update
            self.collective,
            buckets,
            compressor=self.compressor,
            reducer=self.ctx.reducer,
            weight=float(tokens),
            timeout=self.config.sync_timeout,
        )
        wait = time.perf_counter() - t0
        report = round_report(res, {"comm_wait_s": wait})
        if not res.committed:
            self.failed_rounds += 1
            return report
        for p, g in zip(self.params, unflatten_buckets(res.tensors, layout, grads), strict=True):
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
        self.ctx.optimizer.step()
        self.steps += 1
        return report

    def state_dict(self) -> dict[str, Any]:
        """Step counters and the codec's state (the model and inner optimizer are checkpointed apart)."""
        return {
            "steps": self.steps,
            "failed_rounds": self.failed_rounds,
            "compressor": compressor_state(self.compressor),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()`` output."""
        self.steps = int(state["steps"])
        self.failed_rounds = int(state["failed_rounds"])
        load_compressor_state(self.compressor, dict(state.get("compressor", {})))

    def close(self) -> None:
        return None
