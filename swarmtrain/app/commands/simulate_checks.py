"""``swarmtrain simulate``'s checks before any process starts: names, data paths, attacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["validate_names"]


def validate_names(cfg: Any, n_peers: int) -> None:
    """Resolve registry names early, so a typo fails in one line before any process starts."""
    import optimizers
    from compression import build_compressor
    from peers.reducers import REDUCERS

    optimizers.STRATEGIES.get(cfg.strategy.name)
    build_compressor(cfg.compression)
    REDUCERS.get(cfg.peers.reducer)
    from peers.reducers import build_reducer
    from swarmtrain.core.errors import ConfigError

    for raw in cfg.data.paths:  # every peer would fail on it, after starting
        if not Path(raw).expanduser().exists():
            raise ConfigError(f"data.paths: {raw} does not exist")

    # with fewer peers than the reducer's breakdown point needs, no round could ever commit
    build_reducer(cfg.peers.reducer, cfg.peers.byzantine_f, **cfg.peers.reducer_options).check(n_peers)
    if cfg.simulation.attackers and cfg.simulation.attack != "none":
        from swarmtrain.simulation.attacks import build_attack
        from swarmtrain.simulation.wiring import attack_options

        if cfg.simulation.attackers >= n_peers:
            raise ConfigError(f"--byzantine {cfg.simulation.attackers} leaves no honest peer among {n_peers}")
        # every registered attack runs with real peers; this rejects an unknown name or bad options
        build_attack(cfg.simulation.attack, **attack_options(cfg, n_peers))
    from swarmtrain.simulation.wiring import check_attack_fits_strategy

    check_attack_fits_strategy(cfg)
