"""SWARM rebalancing: who moves where, and the hysteresis that stops ping-pong."""

from __future__ import annotations

import pytest

from peers.swarm.rebalance import plan_move, stage_rates
from peers.swarm.routing import ServerInfo, servers_by_stage
from swarmtrain.core.errors import ConfigError


def _servers(layout: dict[int, list[float]]) -> list[ServerInfo]:
    return [ServerInfo(f"p{st}{i}", st, tp) for st, tps in layout.items() for i, tp in enumerate(tps)]


def test_three_on_stage0_one_on_stage1_moves_one_to_the_bottleneck() -> None:
    servers = _servers({0: [10.0, 10.0, 10.0], 1: [10.0]})
    assert stage_rates(servers_by_stage(servers, 2)) == [30.0, 10.0]
    move = plan_move(servers, 2)
    assert move is not None
    assert (move.peer_id, move.src, move.dst) == ("p00", 0, 1)  # the donor's smallest peer ID
    assert move.rate_before == 10.0 and move.rate_after == 20.0
    # after the move: 2/2, balanced, nobody moves again
    moved = [ServerInfo(s.peer_id, 1 if s.peer_id == "p00" else s.stage, s.throughput) for s in servers]
    assert plan_move(moved, 2) is None


def test_hysteresis_blocks_small_gains() -> None:
    # stage 1 is a bit slower, but moving a fast stage-0 server there would leave stage 0 the bottleneck
    assert plan_move(_servers({0: [10.0, 10.0], 1: [18.0]}), 2) is None
    # a gain of 25 % passes a 20 % hysteresis and fails a 30 % one
    servers = _servers({0: [4.0, 10.0], 1: [8.0]})  # min rate 8 -> 10 after the move
    assert plan_move(servers, 2, hysteresis=0.2) is not None
    assert plan_move(servers, 2, hysteresis=0.3) is None


def test_no_move_when_the_donor_would_empty_or_when_unmeasured() -> None:
    assert plan_move(_servers({0: [30.0], 1: [5.0]}), 2) is None  # the donor has one server
    assert plan_move(_servers({0: [10.0, 10.0, 0.0], 1: [10.0]}), 2) is None  # one not measured yet
    assert plan_move(_servers({0: [10.0, 10.0]}), 2) is None  # a stage without servers: not ours to fix
    with pytest.raises(ConfigError):
        plan_move([], 2, hysteresis=-0.1)


def test_three_stages_the_bottleneck_gets_the_server() -> None:
    move = plan_move(_servers({0: [10.0, 10.0, 10.0], 1: [10.0, 10.0], 2: [10.0]}), 3)
    assert move is not None and (move.src, move.dst) == (0, 2)


def test_a_joining_server_picks_the_bottleneck_stage() -> None:
    from peers.swarm.rebalance import bottleneck_stage

    assert bottleneck_stage([], 3) == 0  # nobody yet: the first stage
    assert bottleneck_stage(_servers({0: [10.0], 2: [10.0]}), 3) == 1  # an empty stage first
    assert bottleneck_stage(_servers({0: [10.0, 10.0, 10.0], 1: [10.0]}), 2) == 1
    assert bottleneck_stage(_servers({0: [5.0], 1: [20.0]}), 2) == 0  # by rate, not by count
    # unmeasured servers count at their stage's mean: stage 0 has 2 x 10, stage 1 has 10 + 10
    assert bottleneck_stage(_servers({0: [10.0, 10.0], 1: [10.0, 0.0]}), 2) == 0


def test_a_move_waits_for_a_plan_that_lasts_and_a_moved_server_cools_down() -> None:
    from peers.swarm.rebalance import Rebalancer

    bal = Rebalancer(2, patience=10.0, cooldown=60.0)
    skewed = _servers({0: [10.0, 10.0, 10.0], 1: [10.0]})
    assert bal.observe(skewed, 0.0) is None  # first seen
    assert bal.observe(skewed, 9.0) is None  # not for long enough yet
    # a spike of balance resets the clock: the imbalance must last
    assert bal.observe(_servers({0: [10.0, 10.0, 2.0], 1: [10.0]}), 9.5) is None
    assert bal.observe(skewed, 10.0) is None
    assert bal.observe(skewed, 19.0) is None
    move = bal.observe(skewed, 20.0)
    assert move is not None and (move.peer_id, move.src, move.dst) == ("p00", 0, 1)
    assert bal.may_move(20.0)
    bal.moved(20.0)
    assert not bal.may_move(79.0) and bal.may_move(80.0)
    assert bal.observe(skewed, 21.0) is None  # the plan starts over after a move
    with pytest.raises(ConfigError):
        Rebalancer(2, patience=-1.0)
    with pytest.raises(ConfigError):
        Rebalancer(1)


def test_rates_around_moves_count_samples_before_the_first_move_and_after_the_last_catch_up() -> None:
    from swarmtrain.simulation.swarm import rates_around_moves

    done = [(float(t), 8) for t in range(0, 21)]  # a micro-batch of 8 every second from 0 to 20
    done += [(float(t) + 0.5, 8) for t in range(12, 20)]  # twice as fast after the move
    before, after = rates_around_moves(done, [(6.0, 12.0)], end=20.0)
    assert before == pytest.approx(6 * 8 / 6.0)  # (0, 6]: 6 micro-batches
    assert after == pytest.approx(16 * 8 / 8.0)  # (12, 20]: 16 micro-batches
    assert rates_around_moves(done, [], end=20.0) == (None, None)
    assert rates_around_moves(done, [(6.0, 20.0)], end=20.0)[1] is None  # never caught up
