"""``Local``: the single-peer strategy. It only steps the inner optimizer; nothing travels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optimizers.base import STRATEGIES, StrategyContext, options_of
from swarmtrain.core.config import LocalConfig
from swarmtrain.core.protocols import StepReport

__all__ = ["Local"]


@STRATEGIES.register("local")
class Local:
    """Plain local training: ``step`` is ``optimizer.step()``. The baseline for a single machine."""

    name = "local"

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx
        self.config = options_of(ctx, LocalConfig)
        self.steps = 0

    def step(self, tokens: int) -> StepReport:
        self.ctx.optimizer.step()
        self.steps += 1
        return StepReport()

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps = int(state["steps"])

    def close(self) -> None:
        return None
