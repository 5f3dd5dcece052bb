"""A volunteer's streak of failed rounds (``swarmtrain.app.peer.loop.FailureStreak``): pure logic."""

from __future__ import annotations

import logging
import time

import pytest

from swarmtrain.app.peer.failure_streak import SAY_AFTER, FailureStreak, RoundsKeepFailing


def test_the_reason_is_said_after_a_few_failures_and_a_commit_resets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = FailureStreak(give_up_after=0.0)  # never gives up
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
    s = FailureStreak(give_up_after=0.2)
    s.failed("first")
    s.committed()  # a commit starts the clock again
    s.failed("a")
    time.sleep(0.25)
    with pytest.raises(
        RoundsKeepFailing, match=r"no round committed in 0 s \(2 failed\); the last failure: b"
    ):
        s.failed("b")


def test_it_gives_up_with_the_most_common_reason_when_a_race_ended_the_last_round() -> None:
    """The CI failure that motivated it: a reducer that can never commit, and the streak's last
    round ended in a race (a peer's round already over), which hid the cause."""
    s = FailureStreak(give_up_after=0.2)
    for _ in range(3):
        s.failed("reducer 'centered_clip' ... it needs n >= 5")
    time.sleep(0.25)
    with pytest.raises(
        RoundsKeepFailing, match=r"\(4 failed\); 3 of them: reducer 'centered_clip' \.\.\. it needs n >= 5"
    ):
        s.failed("sending failed: peer QmX refused part: its round is over")
