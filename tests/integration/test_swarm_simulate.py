"""``swarmtrain simulate --strategy swarm`` with a server SIGKILLed mid-run (or ``--chaos``): nothing
lost, rerouted.

The real CLI in a subprocess: a bootstrap node, 4 stage servers (2 per stage) and a trainer, each a
real process on 127.0.0.1; one server is SIGKILLed at a random moment between 15 % and 60 % of the
run. Training goes on: every micro-batch completes (those in flight on the dead server are rerouted
to its stage's other server), the surviving replicas of each stage end bit-identical after their
last average, and the loss went down from the initial ln(256). The replicas of a stage step together
on the stage's mean gradient, so the run follows the single-process baseline (``--baseline``: the same
stages, micro-batches and optimizer steps) to within 3 % of its final loss; when each replica stepped
on its own share of the micro-batches between parameter averages, the issue's run was 5.7-8.5 % above.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow  # 20-47 s: out of the quick loop
@pytest.mark.timeout(300)
def test_swarm_survives_a_killed_server(tmp_path: Path) -> None:
    out = tmp_path / "swarm.json"
    argv = [sys.executable, "-m", "swarmtrain", "simulate", "--strategy", "swarm", "--stages", "2"]
    argv += ["--peers", "4", "--kill-servers", "1", "--steps", "40", "--batch-size", "8", "--baseline"]
    argv += ["--json", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    for key in (
        "strategy", "stages", "servers_per_stage", "trainers", "samples", "final_val_loss",
        "baseline_val_loss", "throughput_samples_per_s", "rerouted", "lost_microbatches",
        "rebalance_moves", "bytes_sent_per_peer", "params_identical",
    ):  # fmt: skip
        assert key in res, key
    assert res["servers_per_stage"] == [2, 2] and len(res["killed"]) == 1
    assert res["lost_microbatches"] == 0
    assert res["samples"] == 40 * 8
    assert res["rerouted"] >= 1
    assert res["params_identical"] is True
    assert max(res["final_syncs"].values()) == 2  # the stage that kept both replicas averaged them
    assert res["final_val_loss"] < math.log(256) - 1.0  # it trained
    assert res["steps_taken"] == 40  # one optimizer step per micro-batch, on every replica
    gap = res["final_val_loss"] / res["baseline_val_loss"] - 1.0
    assert abs(gap) < 0.03, (res["final_val_loss"], res["baseline_val_loss"])
    assert len(res["bytes_sent_per_peer"]) == 4  # 3 surviving servers and the trainer
    assert all(v > 0 for v in res["bytes_sent_per_peer"].values())
    # the memory figures of issue 35, as DiLoCo's simulate reports them: 4 servers and a trainer
    assert 50 < res["rss_per_peer_mib"] < res["peak_rss_total_mib"], res
    assert res["peak_rss_total_mib"] >= 3 * res["rss_per_peer_mib"], res
    assert "MiB per peer" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_swarm_under_chaos_restarts_servers_that_catch_up(tmp_path: Path) -> None:
    """``--chaos`` on SWARM: servers SIGKILLed and SIGTERMed at random moments and restarted with
    the same identity and stage; a restarted server downloads its stage's state from a replica and
    serves again. Nothing is lost, the replicas end identical, the loss follows the clean run."""
    out = tmp_path / "chaos.json"
    argv = [sys.executable, "-m", "swarmtrain", "simulate", "--strategy", "swarm", "--stages", "2"]
    argv += ["--peers", "4", "--steps", "80", "--batch-size", "8", "--json", str(out)]
    argv += ["--chaos", "kill=6/min,preempt=3/min,restart=5s,seed=1"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=560)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["kills"] >= 1 and res["kills"] + res["preemptions"] >= 2, res["timeline"]
    assert res["restarts"] >= 1 and res["restarts_caught_up"] >= 1, res["timeline"]
    assert res["lost_microbatches"] == 0 and res["samples"] == 80 * 8
    assert res["params_identical"] is True
    assert res["rounds_committed"] == res["clean_rounds_committed"] == 80
    assert abs(res["loss_vs_clean"]) < 0.03, (res["final_val_loss"], res["clean_val_loss"])
    assert "restarts caught up" in proc.stdout


@pytest.mark.timeout(300)
def test_two_trainers_accumulating_steps_follow_one_process() -> None:
    """2 trainers x 2 micro-batches per optimizer step over 3 servers (2 on stage 0): a step's 4
    micro-batches split unevenly between stage 0's replicas (3:1 as often as 2:2), which the summed
    gradients divided by the trainers' counts take exactly; the collective's weighted mean bounds a
    weight by twice the median and ended this run 0.15 % off the baseline."""
    from swarmtrain.core.config import load_config
    from swarmtrain.core.swarm_config import SwarmConfig
    from swarmtrain.simulation.swarm import run_swarm_simulation

    cfg = load_config(None, {"train.steps": 12, "train.batch_size": 8})
    settings = SwarmConfig(stages=2, microbatches=12, trainers=2, accumulate=2)
    res = run_swarm_simulation(cfg, settings, 3, baseline=True, timeout=240)
    assert res.lost_microbatches == 0 and res.params_identical
    assert res.steps_taken == 6 and res.step_failures == 0
    assert res.baseline_val_loss is not None
    assert res.final_val_loss == pytest.approx(res.baseline_val_loss, rel=5e-4)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_int8_hidden_states_end_within_3_percent_of_fp32_on_the_same_run() -> None:
    """The same micro-batches and steps through the same 2 servers, once with fp32 hidden states and
    their gradients between the stages and once with int8 (blockwise): the loss stays within 3 %
    and the bytes between the stages drop to about a quarter."""
    from swarmtrain.core.config import load_config
    from swarmtrain.core.swarm_config import SwarmConfig
    from swarmtrain.simulation.swarm import run_swarm_simulation

    cfg = load_config(None, {"train.steps": 40, "train.batch_size": 8})
    runs = {}
    for codec in ("none", "int8"):
        settings = SwarmConfig(stages=2, codec=codec, microbatches=40, trainers=1)
        runs[codec] = run_swarm_simulation(cfg, settings, 2, timeout=280)
    fp32, int8 = runs["none"], runs["int8"]
    assert fp32.lost_microbatches == 0 and int8.lost_microbatches == 0
    assert fp32.final_val_loss < math.log(256) - 1.0  # it trained
    assert abs(int8.final_val_loss / fp32.final_val_loss - 1.0) < 0.03
    assert int8.final_val_loss != fp32.final_val_loss  # the codec really ran
    kinds = ("activations", "gradients")
    hidden = {k: sum(r.bytes_sent_by_kind[x] for x in kinds) for k, r in runs.items()}
    assert hidden["int8"] < 0.35 * hidden["none"], hidden
