"""SWARM's pure logic: weighted random wiring, deadlines from service times, micro-batch bookkeeping."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from peers.swarm.deadlines import ServiceTimes
from peers.swarm.routing import ServerInfo, pick_server, route_weight, server_from_record, servers_by_stage
from peers.swarm.tracker import Exclusions, MicrobatchTracker
from swarmtrain.core.errors import ConfigError, ProtocolError


def test_picks_follow_throughput_over_queue() -> None:
    fast = ServerInfo("a", 0, throughput=300.0, queue=0)
    slow = ServerInfo("b", 0, throughput=100.0, queue=0)
    busy = ServerInfo("c", 0, throughput=300.0, queue=2)  # 300 / 3 = 100
    rng = random.Random(1)
    counts = Counter(pick_server([fast, slow, busy], (), rng).peer_id for _ in range(20_000))  # type: ignore[union-attr]
    assert counts["a"] / 20_000 == pytest.approx(0.6, abs=0.02)
    assert counts["b"] / 20_000 == pytest.approx(0.2, abs=0.02)
    assert counts["c"] / 20_000 == pytest.approx(0.2, abs=0.02)


def test_excluded_never_picked_and_none_when_all_excluded() -> None:
    servers = [ServerInfo("a", 0, 10.0), ServerInfo("b", 0, 10.0)]
    rng = random.Random(0)
    assert {pick_server(servers, {"a"}, rng).peer_id for _ in range(200)} == {"b"}  # type: ignore[union-attr]
    assert pick_server(servers, {"a", "b"}, rng) is None
    assert pick_server([], (), rng) is None


def test_unmeasured_server_weighted_like_the_median() -> None:
    new = ServerInfo("n", 1, throughput=0.0)
    assert route_weight(new, default_throughput=50.0) == 50.0
    rng = random.Random(3)
    pool = [ServerInfo("a", 1, 40.0), ServerInfo("b", 1, 60.0), new]
    counts = Counter(pick_server(pool, (), rng).peer_id for _ in range(9000))  # type: ignore[union-attr]
    assert counts["n"] / 9000 == pytest.approx(50 / 150, abs=0.03)


def test_records_parse_and_group_by_stage() -> None:
    info = server_from_record("p", "server", 12.5, {"stage": 1, "queue": 3, "ver": 7}, stages=2)
    assert info == ServerInfo("p", 1, 12.5, 3, 7)
    assert server_from_record("t", "trainer", 0.0, {}, stages=2) is None
    syncing = server_from_record("q", "server", 0.0, {"stage": 0, "sync": 1}, stages=2)
    assert syncing is not None and syncing.syncing
    # a server catching up with its stage takes step closes, never micro-batches
    rng = random.Random(0)
    assert pick_server([syncing], (), rng) is None
    assert {pick_server([syncing, info], (), rng).peer_id for _ in range(50)} == {"p"}  # type: ignore[union-attr]
    bad = ({"stage": 2}, {"stage": "0"}, {"stage": 0, "queue": -1}, {"stage": True}, {"stage": 0, "sync": 2})
    for extra in bad:
        with pytest.raises(ProtocolError):
            server_from_record("p", "server", 1.0, extra, stages=2)
    with pytest.raises(ProtocolError):
        server_from_record("p", "server", float("nan"), {"stage": 0}, stages=2)
    grouped = servers_by_stage([ServerInfo("b", 0), ServerInfo("a", 0), ServerInfo("c", 1)], 3)
    assert [[s.peer_id for s in g] for g in grouped] == [["a", "b"], ["c"], []]


def test_deadlines_come_from_measurements() -> None:
    t = ServiceTimes(first_contact=30.0, slack=3.0, quantile=0.9, window=10, min_samples=3, floor=0.01)
    assert t.deadline(0, "fwd") == 30.0  # nothing measured yet
    for s in (0.1, 0.2, 0.1, 0.1, 0.3, 0.1, 0.1, 0.2, 0.1, 0.1):
        t.record(0, "fwd", s)
    assert t.measured(0, "fwd") == pytest.approx(0.2)
    assert t.deadline(0, "fwd") == pytest.approx(0.6)
    assert t.deadline(0, "fwd", queue=2) == pytest.approx(1.8)  # waits behind two requests
    assert t.deadline(1, "fwd") == 30.0  # per stage
    for _ in range(10):  # the machine slowed down: timeouts widen the deadline
        t.record(0, "fwd", 0.6)
    assert t.deadline(0, "fwd") == pytest.approx(1.8)
    t.record(0, "fwd", float("nan"))  # ignored
    with pytest.raises(ConfigError):
        ServiceTimes(min_samples=5, window=3)


def test_exclusions_expire() -> None:
    ex = Exclusions(ttl=10.0)
    ex.exclude("a", now=0.0)
    ex.exclude("b", now=0.0, ttl=1.0)
    assert ex.active(0.5) == {"a", "b"}
    assert ex.active(2.0) == {"a"}
    ex.exclude("a", now=3.0, ttl=1.0)  # a shorter exclusion does not cut a running one
    assert ex.active(9.0) == {"a"}
    assert ex.active(10.0) == frozenset()


def test_tracker_counts_each_microbatch_once() -> None:
    tr = MicrobatchTracker()
    tr.start(0)
    tr.start(1)
    tr.reroute(1, "timeout")
    tr.reroute(1, "busy")
    tr.complete(1, samples=8)
    assert tr.stats.rerouted == 2 and tr.stats.completed == 1 and tr.stats.samples == 8
    assert tr.stats.reasons == {"timeout": 1, "busy": 1}
    assert tr.stats.lost == 1 and tr.in_flight() == {0}
    with pytest.raises(ConfigError):
        tr.complete(1, samples=8)  # counted twice
    with pytest.raises(ConfigError):
        tr.start(1)  # fed twice
    with pytest.raises(ConfigError):
        tr.reroute(5)
    tr.complete(0, samples=8)
    assert tr.stats.lost == 0 and tr.stats.samples == 16


def test_a_microbatch_fed_again_is_still_counted_once() -> None:
    # a dead server took its gradients: the trainer feeds it again (peers.swarm.client.close_step)
    tr = MicrobatchTracker()
    tr.start(0)
    with pytest.raises(ConfigError):
        tr.reopen(0)  # not completed yet
    tr.complete(0, samples=8)
    tr.reopen(0)
    tr.reroute(0, "error")  # its requests may be rerouted again
    assert tr.in_flight() == {0}
    tr.complete(0, samples=8, again=True)
    assert tr.stats.started == tr.stats.completed == 1 and tr.stats.samples == 8 and tr.stats.lost == 0
