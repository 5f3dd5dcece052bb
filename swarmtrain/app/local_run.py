"""The defaults of a local multi-peer run: ``swarmtrain simulate`` and the bench grid start from them."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["CROWD_FREE", "JOIN_S_PER_CROWD", "SIMULATE_DEFAULTS", "crowded_defaults", "crowded_join_window"]

# simulate's defaults: the README's tiny run
SIMULATE_DEFAULTS: dict[str, Any] = {
    "peers": {"admission": "token"},  # a run key and a token per peer, as `swarmtrain run init` makes
    "strategy": {"name": "diloco", "inner_steps": 30},
    "compression": {"codec": "int8"},
    "train": {"steps": 300, "eval_interval": 10_000},
}

#: seconds of join window per peer per core beyond :data:`CROWD_FREE` (simulate's default window)
JOIN_S_PER_CROWD = 2.0
#: peers per core up to which the hand-set join window (3 s) holds: the arrivals of more peers
#: sharing the cores spread wider (16 peers on 2 cores, started together: 2.3 s at the first sync,
#: and one peer late costs a state download that leaves it behind in the next round too)
CROWD_FREE = 4.0


def crowded_join_window(peers: int, cpus: int) -> float | None:
    """The join window a run of ``peers`` on ``cpus`` cores starts with, when more than the hand-set
    one (``None``: that one holds)."""
    crowd = peers / max(cpus, 1)
    return round(JOIN_S_PER_CROWD * crowd, 1) if crowd > CROWD_FREE else None


def crowded_defaults(base: dict[str, Any], peers: int) -> dict[str, Any]:
    """``base`` with the join window :func:`crowded_join_window` gives ``peers`` on this machine's
    cores, when it gives one."""
    window = crowded_join_window(peers, os.cpu_count() or 1)
    if window is None:
        return base
    return {**base, "peers": {**base.get("peers", {}), "join_window": window}}
