"""``swarmtrain.simulation.outsider.CpuCap``: an intruder's loop sleeps until its own CPU time is
within its share of the wall time, so on one shared machine it does not take the honest peers' cores."""

from __future__ import annotations

import time

import pytest

from swarmtrain.simulation.outsider import CpuCap


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_busy_work_is_followed_by_a_sleep_that_brings_the_share_down() -> None:
    t0 = time.monotonic()
    cap = CpuCap(0.25)
    _burn(0.2)
    due = cap.due_s()
    wall = time.monotonic() - t0
    # 0.2 s of CPU is 0.8 s of wall at a quarter core, less the wall the burn took (however loaded
    # this machine is)
    assert 0.8 - wall - 0.01 <= due <= 0.8 + 0.05
    t0 = time.monotonic()
    cap.pause(lambda: False)
    assert time.monotonic() - t0 >= due - 0.05
    assert cap.due_s() < 0.05  # within its share again


def test_a_stop_ends_the_pause_and_idle_time_owes_nothing() -> None:
    cap = CpuCap(0.01)
    _burn(0.1)  # 10 s due
    t0 = time.monotonic()
    cap.pause(lambda: time.monotonic() - t0 > 0.3)
    assert time.monotonic() - t0 < 2.0
    idle = CpuCap(0.5)
    time.sleep(0.2)
    assert idle.due_s() == 0.0
    with pytest.raises(ValueError):
        CpuCap(0)
