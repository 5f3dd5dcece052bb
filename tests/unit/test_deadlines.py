"""Adaptive deadlines (``peers.rounds.deadlines``): hand-set values are first guesses and ceilings, measured
times set the rest, a minority of stragglers does not move the bounds, timeouts that were too tight
widen again."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peers.rounds.deadlines import DeadlineConfig, Deadlines, robust_bound

times = st.floats(min_value=0.0, max_value=1e4, allow_nan=False, allow_infinity=False)


def test_the_hand_set_values_are_the_first_guess() -> None:
    d = Deadlines(3.0)
    assert d.join_window() == 3.0 and d.round_timeout(60.0) == 60.0
    d.observe_arrivals([0.1])
    d.observe_round(1.0)
    assert d.join_window() == 3.0 and d.round_timeout(60.0) == 60.0  # one sample is not enough


@given(ceiling=st.floats(min_value=0.01, max_value=600.0), spreads=st.lists(times, min_size=0, max_size=40))
def test_a_join_window_stays_between_its_floor_and_the_hand_set_ceiling(
    ceiling: float, spreads: list[float]
) -> None:
    d = Deadlines(ceiling)
    for s in spreads:
        d.observe_arrivals([s])
    w = d.join_window()
    assert min(max(d.config.join_floor, ceiling / 2), ceiling) <= w <= ceiling


@given(ceiling=st.floats(min_value=0.01, max_value=3600.0), rounds=st.lists(times, min_size=0, max_size=40))
def test_a_round_timeout_stays_between_its_floor_and_the_hand_set_ceiling(
    ceiling: float, rounds: list[float]
) -> None:
    d = Deadlines(3.0)
    for r in rounds:
        d.observe_round(r)
    t = d.round_timeout(ceiling)
    assert min(max(d.config.round_floor, ceiling / 4), ceiling) <= t <= ceiling


@given(
    fast=st.lists(st.floats(min_value=0.0, max_value=0.4), min_size=9, max_size=9),
    slow=st.lists(st.floats(min_value=4.0, max_value=1e3), min_size=0, max_size=4),
)
def test_a_minority_of_stragglers_does_not_hold_the_window_open(fast: list[float], slow: list[float]) -> None:
    d = Deadlines(20.0, DeadlineConfig(history=13, join_floor_fraction=0.1))
    d.observe_arrivals(fast + slow)
    # the fast peers' spread sets the window: well under the hand-set 20 s, above most of them
    w = d.join_window()
    assert w < 20.0
    assert w >= min(max(sorted(fast)[len(fast) // 2], d.config.join_floor), 20.0)


def test_a_straggler_in_every_round_does_not_set_the_window() -> None:
    # three members per round: the leader, a fast peer 0.1 s after it, a straggler 8 s after it
    d = Deadlines(20.0, DeadlineConfig(join_floor_fraction=0.1))
    for _ in range(4):
        d.observe_arrivals([0.0, 0.1, 8.0])
    assert d.join_window() < 8.0  # the next round goes on without the straggler, not after 20 s


def test_the_window_follows_the_recent_rounds_only() -> None:
    d = Deadlines(20.0, DeadlineConfig(history=4))
    for _ in range(4):
        d.observe_arrivals([6.0])
    assert d.join_window() == pytest.approx(12.0)  # twice the bound
    for _ in range(4):
        d.observe_arrivals([0.2])
    assert d.join_window() == pytest.approx(10.0)  # the floor: half the hand-set window


def test_rounds_that_time_out_widen_the_timeout_again() -> None:
    d = Deadlines(3.0)
    for _ in range(4):
        d.observe_round(2.0)
    tight = d.round_timeout(120.0)
    assert tight == pytest.approx(30.0)  # the floor: a quarter of the hand-set 120 s
    for _ in range(16):
        d.observe_round(tight)  # each failed round counts as a round of its whole timeout
    assert d.round_timeout(120.0) == pytest.approx(60.0)  # 2 x the median of the censored samples
    for _ in range(16):
        d.observe_round(d.round_timeout(120.0))
    assert d.round_timeout(120.0) == 120.0


@given(st.lists(times, min_size=1, max_size=50))
def test_the_robust_bound_is_at_least_the_median(xs: list[float]) -> None:
    b = robust_bound(xs, 4.0)
    assert math.isfinite(b) and b >= sorted(xs)[(len(xs) - 1) // 2] - 1e-9


def test_a_leaving_peer_bounds_its_round_by_its_grace() -> None:
    d = Deadlines(3.0)
    d.end_by = time.monotonic() + 5.0
    assert 4.0 < d.round_timeout(60.0) <= 5.0
    d.end_by = time.monotonic() - 1.0  # already past: the round fails at once instead of hanging
    assert d.round_timeout(60.0) == 0.1


def test_bad_input_fails_loudly() -> None:
    with pytest.raises(ValueError):
        Deadlines(0.0)
    with pytest.raises(ValueError):
        Deadlines(1.0).observe_arrivals([float("nan")])
    with pytest.raises(ValueError):
        DeadlineConfig(min_samples=0)
    with pytest.raises(ValueError):
        robust_bound([], 1.0)


def test_bounds_on_the_rounds_only_tighten() -> None:
    d = Deadlines(3.0)
    d.end_no_later_than(None)  # no token expiry: no bound
    assert d.end_by is None
    d.end_no_later_than(100.0)  # the token's expiry
    d.end_no_later_than(50.0)  # then a preemption's grace, sooner
    d.end_no_later_than(80.0)  # a later bound does not loosen it
    assert d.end_by == 50.0
