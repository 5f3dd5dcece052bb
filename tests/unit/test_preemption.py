"""The pure decisions of the preemption hand-off (``swarmtrain.app.peer.preemption``): when a peer told to
leave trains on to its next sync, and when its committed state is safe with the peers that stay."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmtrain.app.peer.preemption import LEAVE_RESERVE_S, Preemption, finish_sync, handoff_status
from swarmtrain.app.peer.state import vouchable


def test_train_on_to_the_sync_only_when_it_and_its_round_fit() -> None:
    assert finish_sync(3.0, 2.0, 10.0)
    assert finish_sync(8.0, 2.0, 10.0)  # exactly fits
    assert not finish_sync(9.0, 2.0, 10.0)
    assert not finish_sync(None, 2.0, 10.0)  # the time to the sync is unknown: leave now
    assert not finish_sync(1.0, 1.0, float("-inf"))


def test_the_state_is_safe_once_a_peer_that_stays_announces_it() -> None:
    live = [("a", True), ("b", False), ("c", False)]
    assert handoff_status("a", 5, live, {"a": 5, "b": 5}) == "done"
    assert handoff_status("a", 5, live, {"a": 5, "c": 7}) == "done"  # a newer state holds ours too
    assert handoff_status("a", 5, live, {"a": 5, "b": 4}) == "wait"  # b is behind: it must take ours
    assert handoff_status("a", 5, live, {"a": 5}) == "wait"  # c is still downloading


def test_with_two_vouchers_the_state_waits_for_two_holders_that_stay() -> None:
    # a newcomer takes a state only when two donors vouch for it: one committer left alone with it
    # would leave it unadoptable, so the leaver waits for a second holder (fewer when fewer stay)
    live = [("a", True), ("b", False), ("c", False)]
    assert handoff_status("a", 5, live, {"a": 5, "b": 5, "c": 4}, holders=2) == "wait"
    assert handoff_status("a", 5, live, {"a": 5, "b": 5, "c": 5}, holders=2) == "done"
    assert handoff_status("a", 5, live, {"a": 5, "b": 6, "c": 5}, holders=2) == "done"
    assert handoff_status("a", 5, [("a", True), ("b", False)], {"a": 5, "b": 5}, holders=2) == "done"


def test_a_downloaded_state_is_vouched_for_again_only_when_two_donors_vouched_for_it() -> None:
    assert vouchable({"vouched_by": 2}, 2) and vouchable({"vouched_by": 3}, 1)
    assert not vouchable({"vouched_by": 1}, 1)  # a lone donor's state is never passed on as vouched
    assert not vouchable({"vouched_by": 2}, 3)  # fewer than the run asks for
    assert not vouchable({}, 2) and not vouchable({"vouched_by": True}, 1)


def test_peers_that_leave_too_do_not_count_as_holders() -> None:
    # two peers preempted together: each holds the state, neither may count on the other
    live = [("a", True), ("b", True), ("c", False)]
    assert handoff_status("a", 5, live, {"a": 5, "b": 5, "c": 4}) == "wait"
    assert handoff_status("a", 5, [("a", True), ("b", True)], {"b": 5}) == "alone"
    assert handoff_status("a", 5, [], {}) == "alone"


def test_the_grace_clock_keeps_a_reserve_for_leaving() -> None:
    p = Preemption(30.0)
    assert p.left() == float("inf")  # no signal yet
    p.on_signal(15)
    first = p.signalled_at
    p.on_signal(15)  # a second signal does not restart the clock
    assert p.signalled_at == first
    assert 30.0 - LEAVE_RESERVE_S - 1.0 < p.left() <= 30.0 - LEAVE_RESERVE_S
    short = Preemption(3.0)
    short.signalled_at = time.monotonic()
    assert short.reserve == pytest.approx(1.0)
    with pytest.raises(ValueError):
        Preemption(0.0)


def test_the_watchdog_says_its_last_words_before_it_ends_the_process(tmp_path: Path) -> None:
    """``os._exit`` skips every ``finally``: ``join`` writes its ``--json`` summary in ``last_words``,
    or a volunteer whose leaving outlived the grace leaves no summary at all."""
    out = tmp_path / "last.txt"
    script = f"""
import subprocess
import sys
import time
from pathlib import Path
from swarmtrain.app.peer.preemption import Preemption
p = Preemption(1.0)
p.last_words = lambda: open({str(out)!r}, "w").write("said")
p.arm()
p.on_signal(15)
time.sleep(30)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "grace is over" in proc.stderr
    assert out.read_text() == "said"
