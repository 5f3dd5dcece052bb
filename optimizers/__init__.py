"""Distributed training algorithms: what to send, when, and what to do with the result.

Strategies register by name in ``STRATEGIES``; ``build_strategy`` makes one from a config:
``local``, ``data_parallel`` (gradient all-reduce every step), ``diloco`` (Douillard et al. 2023),
``streaming_diloco`` (Douillard et al. 2025) and ``demo`` (Peng, Quesnelle, Kingma 2024).
Each strategy reads its own validated options model from ``ctx.config`` (``DiLoCoConfig``, ...,
in ``swarmtrain.core.config``; ``strategy_config(name, **options)`` builds one by name).
``InProcessGroup`` is a thread-backed ``Collective`` for unit tests and single-process benchmarks.
"""

from __future__ import annotations

from optimizers.base import STRATEGIES, StrategyContext, build_strategy
from optimizers.data_parallel import DataParallel
from optimizers.dct import ChunkedDCT
from optimizers.demo import DeMo
from optimizers.diloco import DiLoCo
from optimizers.inprocess import InProcessCollective, InProcessGroup
from optimizers.local import Local
from optimizers.outer import OuterSGD
from optimizers.streaming_diloco import StreamingDiLoCo

__all__ = [
    "STRATEGIES",
    "StrategyContext",
    "build_strategy",
    "Local",
    "DataParallel",
    "DiLoCo",
    "StreamingDiLoCo",
    "DeMo",
    "OuterSGD",
    "ChunkedDCT",
    "InProcessGroup",
    "InProcessCollective",
]
