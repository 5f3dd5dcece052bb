"""The strategy registry and the context every strategy is built from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from swarmtrain.config import CompressionConfig, StrategyConfig
from swarmtrain.errors import ConfigError
from swarmtrain.protocols import Collective, Reducer, Strategy
from swarmtrain.registry import Registry

__all__ = ["STRATEGIES", "StrategyContext", "build_strategy"]


@dataclass
class StrategyContext:
    """Everything a strategy needs: the model, its inner optimizer, and how to talk to peers.

    ``collective`` is ``None`` for a single-peer run; networked strategies refuse to start without one.
    ``reducer`` is applied by partition owners (``None``: token-weighted mean).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    config: StrategyConfig
    compression: CompressionConfig
    collective: Collective | None = None
    reducer: Reducer | None = None


StrategyFactory = Callable[[StrategyContext], Strategy]
STRATEGIES: Registry[StrategyFactory] = Registry("strategy")


def build_strategy(ctx: StrategyContext) -> Strategy:
    """Build the strategy named by ``ctx.config.name``.

    Raises:
        ConfigError: unknown name, or a networked strategy without a collective.
    """
    factory = STRATEGIES.get(ctx.config.name)
    strategy = factory(ctx)
    if strategy is None:  # pragma: no cover - a factory bug
        raise ConfigError(f"strategy {ctx.config.name!r} factory returned nothing")
    return strategy
