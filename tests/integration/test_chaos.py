"""Chaos on loopback: real peer processes SIGKILLed or SIGTERMed at random moments and restarted with
the same identity; the survivors go on, the restarted peers rejoin through the state download, and
everyone ends with the same parameters. Nothing of the run outlives it."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import pytest

from swarmtrain.core.config import Config, load_config
from swarmtrain.simulation.chaos import parse_chaos
from swarmtrain.simulation.runner import run_simulation

TAG_ENV = "CHAOS_TEST_TREE"  # inherited by every process the run starts (not SWARMTRAIN_*: config)


def _cfg(**overrides: Any) -> Config:
    base: dict[str, Any] = {
        "train.eval_interval": 10_000,
        "train.log_interval": 5,
        "train.steps": 200,  # long enough that a fault comes before the quiet last quarter
        "train.batch_size": 8,
        "train.eval_batches": 4,
        "peers.min_peers": 2,
        "peers.admission": "token",
        "strategy.name": "diloco",
        "strategy.inner_steps": 10,
        "compression.codec": "int8",
    }
    base.update(overrides)  # an override of None drops the key (another strategy's option)
    return load_config(None, {k: v for k, v in base.items() if v is not None}, env={})


def _own_tracker(p: Any) -> bool:
    """This test process's own multiprocessing resource tracker (started during the run when no
    earlier test started it, so it inherits the tag; it lives as long as pytest does)."""
    return bool(p.ppid() == os.getpid() and any("resource_tracker" in a for a in p.cmdline()))


def _tagged(tag: str) -> list[Any]:
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if p.environ().get(TAG_ENV) == tag and not _own_tracker(p):
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_kills_and_restarts_peers_and_the_survivors_agree() -> None:
    tag = uuid.uuid4().hex
    os.environ[TAG_ENV] = tag
    try:
        res = run_simulation(
            _cfg(), 3, chaos=parse_chaos("kill=4/min,preempt=4/min,restart=2s,seed=5"), timeout=500
        )
    finally:
        os.environ.pop(TAG_ENV, None)
    faults = res.kills + res.preemptions
    print(f"\n{res.kills} kills, {res.preemptions} preemptions in {res.wall_s:.0f} s: {res.timeline}")
    assert faults >= 1, res.timeline
    events = [e["event"] for e in res.timeline]
    # every fault came back with the same rank (and identity file) and adopted the swarm's state
    assert res.restarts == faults and events.count("rejoined") == faults, res.timeline
    assert res.missing_ranks == [] and len(res.outcomes) == 3
    restarted = {e["rank"] for e in res.timeline if e["event"] == "rejoined"}
    for o in res.outcomes:
        if o.rank in restarted:
            assert o.donors, f"peer {o.rank} restarted without downloading the state"
    assert res.params_identical, [(o.rank, o.final_digest) for o in res.outcomes]
    assert res.rounds_committed >= 4
    assert all(e["t"] >= 0 and e["rank"] in (0, 1, 2) for e in res.timeline)
    deadline = time.monotonic() + 10  # processes killed at teardown take a moment to be reaped
    while _tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, p.name(), " ".join(p.cmdline()[:4])) for p in _tagged(tag)]
    assert left == []  # no process of the run is left


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_streaming_diloco_under_fast_chaos_ends_identical() -> None:
    """``benchmarks/chaos.py --quick``'s Streaming DiLoCo run (a fault every 5 s, restarts after 3 s).
    A restarted peer used to download the swarm's state again after every failed round, although
    nobody had committed since it got that state: each time it threw away its steps and set its step
    count back, ended the run behind the others, and committed its last rounds without the peers that
    had finished (not identical in 3 runs of 3). It now keeps its state when the donors vouch for
    the very one it holds."""
    cfg = _cfg(**{"strategy.name": "streaming_diloco", "train.steps": 60})
    res = run_simulation(cfg, 3, chaos=parse_chaos("kill=12/min,restart=3s,seed=1"), timeout=500)
    print(f"\n{res.kills} kills in {res.wall_s:.0f} s: {res.timeline}")
    assert res.kills >= 1 and res.restarts >= 1, res.timeline
    assert res.params_identical, [(o.rank, o.steps, o.final_digest[:12]) for o in res.outcomes]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_under_fast_chaos_ends_identical() -> None:
    """DeMo steps the parameters every round, so a restarted peer must take exactly the others' steps
    after adopting their state. It used to read its learning rate from the optimizer's param groups
    as they were before the adopted state's ``load_state_dict`` replaced them: its first committed
    round already gave another digest, no two donors vouched alike from then on, and the next peer
    that restarted found no state (the run exited 1)."""
    cfg = _cfg(**{"strategy.name": "demo", "strategy.inner_steps": None, "train.steps": 60})
    res = run_simulation(cfg, 3, chaos=parse_chaos("kill=12/min,restart=3s,seed=1"), timeout=500)
    print(f"\n{res.kills} kills in {res.wall_s:.0f} s: {res.timeline}")
    assert res.kills >= 1 and res.restarts >= 1, res.timeline
    assert res.missing_ranks == [] and len(res.outcomes) == 3
    assert res.params_identical, [(o.rank, o.steps, o.final_digest[:12]) for o in res.outcomes]
