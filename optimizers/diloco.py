"""``DiLoCo``: H local steps of the inner optimizer, then an outer Nesterov step on the averaged
pseudo-gradient.

Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models". Every
peer keeps an *anchor* (the last global parameters). After each ``H = inner_steps`` inner steps:

    delta_i = anchor - local_i                         (pseudo-gradient, per peer)
    delta   = all_reduce(delta_i, weight = tokens_i)   (through the configured codec)
    anchor  = OuterSGD(anchor, delta)                  (Nesterov; lr 1.0, momentum 0.5 by default)
    local_i = anchor

The inner optimizer's state is kept across outer steps, as in the paper. The outer defaults (lr 1.0,
momentum 0.5) are not the paper's 0.7 / 0.9: docs/decisions.md has the sweeps that chose them.

A round that does not commit changes nothing: the peer keeps training from its local parameters and
tries again at the next sync point, where its pseudo-gradient then covers all steps since the last
successful sync (and its weight all those tokens). The codec's error-feedback residual is rolled back
too (``reduce_or_rollback``), or those steps would be counted twice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from optimizers.base import (
    STRATEGIES,
    AnchoredStrategy,
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
from optimizers.outer_store import OuterStore
from swarmtrain.core.config import DiLoCoConfig
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import FastForward, PeriodicStrategy, StepReport

__all__ = ["DiLoCo"]


@STRATEGIES.register("diloco")
class DiLoCo(AnchoredStrategy, PeriodicStrategy, FastForward):
    """DiLoCo with a configurable codec (and error feedback, through the codec) for the pseudo-gradient.

    Options come from ``ctx.config``, a ``DiLoCoConfig``: ``inner_steps`` (H), ``outer_lr``,
    ``outer_momentum``, ``nesterov``, ``sync_timeout``, ``outer_state`` (where the anchor and outer
    momentum live: ``optimizers.outer_store``).

    Raises:
        ConfigError: without a collective, or with another strategy's options.
    """

    name = "diloco"

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx
        self.config = cfg = options_of(ctx, DiLoCoConfig)
        self.collective = require_collective(ctx, self.name)
        self.inner_steps = cfg.inner_steps
        self.compressor = make_compressor(ctx)
        self.params = trainable_parameters(ctx.model)
        # fp32 master copy: outer updates must not be rounded away in bf16/fp16 models
        self.store = OuterStore(self.params, cfg)
        self.anchor = self.store.anchor  # the same dict for the store's life
        self.steps = 0
        self.outer_steps = 0
        self.failed_rounds = 0
        self.tokens_since_sync = 0

    @torch.no_grad()
    def step(self, tokens: int) -> StepReport:
        """One inner step; every ``H`` steps also the outer step.

        ``extra["comm_wait_s"]``: seconds spent inside the blocking all-reduce (0 between syncs).
        """
        self.ctx.optimizer.step()
        self.steps += 1
        self.tokens_since_sync += int(tokens)
        if self.steps % self.inner_steps != 0:
            return StepReport(extra={"comm_wait_s": 0.0})
        return self._sync()

    def fast_forward(self, steps: int) -> int:
        """Start the current period ``steps`` inner steps ahead (at most to its last step): a peer that
        keeps arriving late syncs with the others after fewer steps (``swarmtrain.app.peer.realign``).
        Returns the steps skipped."""
        k = max(0, min(int(steps), self.inner_steps - 1 - self.steps % self.inner_steps))
        self.steps += k
        return k

    def _sync(self) -> StepReport:
        pseudo = {
            n: self.store.anchor_on_device(n) - p.detach().to(torch.float32) for n, p in self.params.items()
        }
        t0 = time.perf_counter()
        res = reduce_or_rollback(
            self.collective,
            pseudo,
            compressor=self.compressor,
            reducer=self.ctx.reducer,
            weight=float(self.tokens_since_sync),
            timeout=self.config.sync_timeout,
        )
        wait = time.perf_counter() - t0
        report = round_report(res, {"comm_wait_s": wait})
        if not res.committed:
            self.failed_rounds += 1
            return report
        self.store.step({n: res.tensors[n] for n in self.params}, self._adopt)
        self.outer_steps += 1
        self.tokens_since_sync = 0
        return report

    def _adopt(self, name: str, anchor: torch.Tensor) -> None:
        self.params[name].copy_(anchor)

    def state_dict(self) -> dict[str, Any]:
        """Anchor, outer momentum, counters and codec state: enough to continue bit-exactly.

        The model parameters and the inner optimizer are checkpointed by the trainer, not here.
        """
        return {
            "steps": self.steps,
            "outer_steps": self.outer_steps,
            "failed_rounds": self.failed_rounds,
            "tokens_since_sync": self.tokens_since_sync,
            "anchor": self.store.anchor_state(),
            "outer": self.store.outer_state(),
            "compressor": compressor_state(self.compressor),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()`` output (shapes are checked against the model)."""
        anchor = dict(state["anchor"])
        if set(anchor) != set(self.params):
            raise ConfigError("DiLoCo state: anchor names do not match the model's parameters")
        for n, p in self.params.items():
            if tuple(anchor[n].shape) != tuple(p.shape):
                raise ConfigError(f"DiLoCo state: anchor {n!r} has shape {tuple(anchor[n].shape)}")
        self.store.load(anchor, state["outer"])
        self.steps = int(state["steps"])
        self.outer_steps = int(state["outer_steps"])
        self.failed_rounds = int(state["failed_rounds"])
        self.tokens_since_sync = int(state["tokens_since_sync"])
        load_compressor_state(self.compressor, dict(state.get("compressor", {})))

    def close(self) -> None:
        return None
