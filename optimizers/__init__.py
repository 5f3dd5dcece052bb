"""Distributed training algorithms: what to send, when, and what to do with the result.

Strategies register by name in ``STRATEGIES``; ``build_strategy`` makes one from a config.
"""

from __future__ import annotations

from optimizers.base import STRATEGIES, StrategyContext, build_strategy
from optimizers.local import Local

__all__ = ["STRATEGIES", "StrategyContext", "build_strategy", "Local"]
