"""The volunteer's live line (``swarmtrain.app.peer.live``): what it says, its width, how often it speaks
when piped, and the sync clock behind "time to next sync"."""

from __future__ import annotations

import io
import re

import pytest

from swarmtrain.app.peer import live as live_mod
from swarmtrain.app.peer.live import LiveLine, format_status
from swarmtrain.app.peer.loop import PeerStatus, SyncClock


def _status(**kw: object) -> PeerStatus:
    base: dict[str, object] = {
        "step": 120,
        "round_id": 6,
        "loss": 2.7807,
        "peers": 3,
        "bytes_up": 25_700_000,
        "bytes_down": 32_200_000,
        "tokens_per_s": 3262.5,
        "next_sync_s": 4.2,
    }
    base.update(kw)
    return PeerStatus(**base)  # type: ignore[arg-type]


def test_the_line_names_every_figure_with_the_live_trainers_and_the_next_round() -> None:
    assert (
        format_status(_status(), 120)
        == "step 120 round 6 (3 trainers) loss 2.781 3.3k tok/s up 24.5M dn 30.7M next round in ~4s"
    )
    assert format_status(_status(peers=1), 120).startswith("step 120 round 6 (1 trainer) ")
    assert "loss -" in format_status(_status(loss=float("nan")))
    assert "next round in ?" in format_status(_status(next_sync_s=None))


def test_a_long_line_drops_the_bytes_then_the_rate_then_the_next_round_and_never_exceeds_its_width() -> None:
    assert format_status(_status()) == "step 120 round 6 (3 trainers) loss 2.781 3.3k tok/s next round in ~4s"
    huge = _status(step=123_456_789, round_id=9_876_543, peers=1000, bytes_up=5 << 40, bytes_down=6 << 40)
    line = format_status(huge)
    assert len(line) <= 77 and " up " not in line and line.startswith("step 123456789 round 9876543")
    assert len(format_status(huge, 50)) <= 60  # step, round and loss always stay


def test_while_it_waits_the_line_says_what_for_instead_of_the_last_steps_figures() -> None:
    text = "waiting for peers: 1 of >= 2 for round 0, 2 live (12s)"
    assert format_status(_status(waiting=text)) == f"step 120 {text}"
    assert len(format_status(_status(waiting="x" * 200))) == 77


def test_piped_it_prints_a_timestamped_line_every_period_and_a_new_reason_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(live_mod.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with LiveLine(every_s=10.0, stream=out, terminal=False) as line:
        for i in range(40):  # 4 steps a second for 10 s
            line.update(_status(step=i))
            clock[0] += 0.25
        line.update(_status(step=40, note="round failed: timeout; catching up"))
        line.update(_status(step=41, note="round failed: timeout; catching up"))  # said already
    lines = out.getvalue().splitlines()
    assert all(re.match(r"\d\d:\d\d:\d\d step \d+ ", x) or "round failed" in x for x in lines), lines
    assert [x.split()[2] for x in lines if " step " in x] == ["0", "40"]  # start, then the note
    assert sum("round failed: timeout" in x for x in lines) == 1
    assert all(len(x) <= 9 + 77 for x in lines)


def test_piped_a_waiting_line_comes_every_period_and_each_says_the_time_waited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(live_mod.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with LiveLine(every_s=10.0, stream=out, terminal=False) as line:
        line.update(_status(step=10))
        for waited in range(3, 40, 3):  # the watch's statuses while a round does not form
            clock[0] += 3.0
            line.update(_status(step=10, waiting=f"waiting for peers: 1 of >= 2 for round 2 ({waited}s)"))
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and "next round in" in lines[0], lines
    assert [x.rsplit("(", 1)[1] for x in lines[1:]] == ["12s)", "24s)", "36s)"]


def test_the_sync_clock_learns_the_period_from_the_syncs_it_sees() -> None:
    c = SyncClock(None)
    assert c.seconds_left(5, 10.0) is None
    c.synced(20)
    c.synced(40)
    assert c.seconds_left(45, 5.0) == pytest.approx(3.0)  # 15 steps at 5 steps/s
    hinted = SyncClock(50)  # DiLoCo's H, before any sync
    assert hinted.seconds_left(10, 10.0) == pytest.approx(4.0)
    assert hinted.seconds_left(10, 0.0) is None
