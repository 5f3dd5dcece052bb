"""SWARM rebalancing over real peers: 3 servers on stage 0 and 1 on stage 1 end 2/2, faster.

Every server is a real process on 127.0.0.1 (``swarmtrain.simulation.swarm``). Each micro-batch
occupies a server an emulated 0.3 s per stage (``device_s``: the stages cost the same, whatever
this machine's cores do), so stage 1's single server is the pipeline's bottleneck. After the
imbalance lasted ``patience`` seconds, stage 0's server with the smallest peer ID leaves at a step
boundary, follows stage 1's steps while it downloads a replica's snapshot (parameters and optimizer
state), replays the steps it followed, and serves stage 1 bit-identical to its replica. Nobody moves
again (the hysteresis), nothing is lost, the replicas are identical, the run still follows the
single-process baseline exactly, and the trainers complete micro-batches faster after the move.
"""

from __future__ import annotations

import pytest


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_rebalancing_moves_a_server_to_the_bottleneck_and_throughput_rises() -> None:
    from swarmtrain.core.config import load_config
    from swarmtrain.core.swarm_config import SwarmConfig
    from swarmtrain.simulation.swarm import run_swarm_simulation

    cfg = load_config(None, {"train.steps": 48, "train.batch_size": 8})
    settings = SwarmConfig(stages=2, microbatches=48, trainers=4, accumulate=2, device_s=0.3, patience=3.0)
    res = run_swarm_simulation(cfg, settings, 4, baseline=True, layout=[3, 1], timeout=450)
    assert res.servers_per_stage == [3, 1]
    assert res.rebalance_moves == 1, res.moves
    assert res.servers_per_stage_end == [2, 2]
    assert (res.moves[0]["src"], res.moves[0]["dst"]) == (0, 1)
    assert res.lost_microbatches == 0 and res.params_identical
    assert res.step_failures == 0
    before, after = res.throughput_before_moves, res.throughput_after_moves
    assert before is not None and after is not None
    assert after > before, (before, after)  # the magnitude, measured: benchmarks/swarm.py
    assert res.baseline_val_loss is not None
    # the mover caught up by replaying the stage's steps: the run is still the one process's
    assert res.final_val_loss == pytest.approx(res.baseline_val_loss, rel=5e-4)
