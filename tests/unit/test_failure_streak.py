"""A volunteer's streak of failed rounds (``swarmtrain.app.peer_loop._FailureStreak``): pure logic."""

from __future__ import annotations

import logging
import time

import pytest

from swarmtrain.app.peer_loop import SAY_AFTER, RoundsKeepFailing, _FailureStreak


def test_the_reason_is_said_after_a_few_failures_and_a_commit_resets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = _FailureStreak(give_up_after=0.0)  # never gives up
    with caplog.at_level(logging.WARNING):
        for _ in range(SAY_AFTER - 1):
            s.failed("reducer 'centered_clip' cannot tolerate f=2 Byzantine peers among n=2: it needs n >= 5")
        assert not caplog.records
        s.failed("reducer 'centered_clip' cannot tolerate f=2 Byzantine peers among n=2: it needs n >= 5")
        assert len(caplog.records) == 1 and "needs n >= 5" in caplog.records[0].getMessage()
        for _ in range(100):
            s.failed("x")  # said once per streak, and 0 never gives up
    s.committed()
    assert s.count == 0


def test_it_gives_up_with_the_last_reason_once_failures_lasted_long_enough() -> None:
    s = _FailureStreak(give_up_after=0.2)
    s.failed("first")
    s.committed()  # a commit starts the clock again
    s.failed("a")
    time.sleep(0.25)
    with pytest.raises(
        RoundsKeepFailing, match=r"no round committed in 0 s \(2 failed\); the last failure: b"
    ):
        s.failed("b")
