"""Attack paths with real peer processes: label flip, ALIE and IPM run under ``run_simulation``.

Label flip: the attacker trains on flipped targets (``PoisonedBatches`` around its sampler). ALIE and
IPM: two attackers share their honest updates over their own ``P2PCollective`` (rounds namespace
``<run>.colluders``) before every round and forge from that estimate. Checks: the attack really ran
(poisoned batches, collusion exchanges with bytes in the ``collude`` ledger kind, none failed), every
round committed with every peer, and the honest peers end bit-identical.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from swarmtrain.core.config import load_config
from swarmtrain.simulation.runner import run_simulation

STEPS, H = 10, 5


def _cfg(attack: str, attackers: int, peers: int) -> Any:
    ov: dict[str, Any] = {
        "train.eval_interval": 10_000,
        "train.log_interval": 5,
        "train.steps": STEPS,
        "train.batch_size": 4,
        "strategy.name": "diloco",
        "strategy.inner_steps": H,
        "compression.codec": "none",
        # every round waits for every peer (what _check_common asserts): on a cold start one
        # peer's imports can take longer than the others' first period, and with fewer the
        # round would close without it
        "peers.min_peers": peers,
        "simulation.attack": attack,
        "simulation.attackers": attackers,
        "peers.round_timeout": 60.0,
    }
    return load_config(None, ov, env={})


def _check_common(res: Any, attackers: int) -> None:
    rounds = STEPS // H
    for o in res.outcomes:
        assert o.committed_rounds == rounds and o.failed_rounds == 0, (o.rank, o.failed_rounds)
        assert math.isfinite(o.final_val_loss)
    honest = res.outcomes[attackers:]
    assert len({o.final_digest for o in honest}) == 1
    assert not any(o.attack_stats for o in honest)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_label_flip_attacker_trains_on_flipped_targets() -> None:
    res = run_simulation(_cfg("label_flip", 1, 3), 3, timeout=500)
    _check_common(res, 1)
    assert res.outcomes[0].attack_stats == {"poisoned_batches": STEPS}
    assert res.params_identical  # label flip sends honest work on poisoned data through the same rounds


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("attack", ["alie", "ipm"])
def test_colluding_attackers_share_their_updates_over_their_own_channel(attack: str) -> None:
    res = run_simulation(_cfg(attack, 2, 4), 4, timeout=800)
    _check_common(res, 2)
    rounds = STEPS // H
    for o in res.outcomes[:2]:
        assert o.attack_stats == {"collusion_exchanges": rounds, "collusion_failed": 0}, o.attack_stats
        collude = o.ledger["by_kind"]["collude"]
        assert collude["sent"] > 0 and collude["received"] > 0
    for o in res.outcomes[2:]:
        assert "collude" not in o.ledger["by_kind"]
