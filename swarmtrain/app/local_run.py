"""The defaults of a local multi-peer run: ``swarmtrain simulate`` and the bench grid start from them."""

from __future__ import annotations

from typing import Any

__all__ = ["SIMULATE_DEFAULTS"]

# simulate's defaults: the README's tiny run
SIMULATE_DEFAULTS: dict[str, Any] = {
    "peers": {"admission": "token"},  # a run key and a token per peer, as `swarmtrain run init` makes
    "strategy": {"name": "diloco", "inner_steps": 30},
    "compression": {"codec": "int8"},
    "train": {"steps": 300, "eval_interval": 10_000},
}
