"""What a volunteer knows of its run while it trains or waits (``swarmtrain.app.peer.run_watch``): the
round the run is at (so a restarted volunteer joins the others' rounds, not its saved state's), the
live trainers, and the waiting line."""

from __future__ import annotations

import threading
import time

from peers.dht.records import PeerRecord
from swarmtrain.app.peer.run_watch import (
    RunView,
    RunWatch,
    Waiting,
    WatchedCollective,
    run_round,
    waiting_text,
)

ME = "QmMe"


def _rec(peer: str, rnd: int, role: str = "trainer", **extra: object) -> PeerRecord:
    return PeerRecord(peer_id=peer, run_id="r", role=role, round=rnd, extra=dict(extra))  # type: ignore[arg-type]


def test_the_run_is_at_the_lower_median_of_the_other_trainers_rounds() -> None:
    assert run_round([_rec("a", 7)], ME) == 7  # the one that stayed while this peer was away
    assert run_round([_rec("a", 7), _rec("b", 9)], ME) == 7
    # one peer publishing a far-off round does not move the others
    assert run_round([_rec("a", 7), _rec("b", 7), _rec("x", 10**9)], ME) == 7
    # its own record, a leaving peer, the bootstrap and a monitor do not count
    recs = [_rec(ME, 50), _rec("a", 3), _rec("b", 40, leaving=1), _rec("d", 60, role="bootstrap")]
    assert run_round([*recs, _rec("m", 70, role="monitor")], ME) == 3
    assert run_round([_rec(ME, 5)], ME) is None


def test_a_peer_moves_up_to_the_runs_round_never_down() -> None:
    view = RunView.of([_rec("a", 4), _rec("b", 4)], ME, 0.0)
    assert view.trainers == 3 and view.at_round == {4: 2}
    assert view.ahead_of(2) == 4  # restarted with its saved state of round 2: it joins round 4
    assert view.ahead_of(4) is None and view.ahead_of(6) is None


def test_the_waiting_line_says_how_many_are_at_its_round_of_how_many_a_round_needs() -> None:
    view = RunView.of([_rec("a", 0)], ME, 0.0)
    w = Waiting("round", 0, since=100.0, needs=2)
    assert waiting_text(w, view, 112.2) == "waiting for peers: 2 of >= 2 for round 0 (12s)"
    alone = RunView.of([_rec("a", 3)], ME, 0.0)  # the other trainer is at another round
    assert waiting_text(w, alone, 105.0) == "waiting for peers: 1 of >= 2 for round 0, 2 live (5s)"
    assert waiting_text(w, None, 101.0) == "waiting for peers: 1 of >= 2 for round 0 (1s)"
    assert waiting_text(Waiting("state", 0, 100.0), None, 104.0) == "downloading the run's state (4s)"


class _Node:
    peer_id = ME

    def __init__(self) -> None:
        self.records = [_rec("a", 1)]

    def live_peers(self, timeout: float = 5.0) -> list[PeerRecord]:
        return self.records


class _Collective:
    round_id = 3

    def __init__(self, watch: RunWatch) -> None:
        self.watch = watch
        self.seen: Waiting | None = None

    def all_reduce(self, tensors: object, **kw: object) -> str:
        self.seen = self.watch.waiting
        return "result"


def test_the_watch_reads_the_records_and_speaks_while_the_trainer_waits_in_a_round() -> None:
    lines: list[str] = []
    spoke = threading.Event()

    def on_wait(text: str) -> None:
        lines.append(text)
        spoke.set()

    node = _Node()
    watch = RunWatch(node, on_wait, every_s=0.05)
    assert watch.read() is not None and watch.view is not None and watch.view.round == 1
    inner = _Collective(watch)
    wrapped = WatchedCollective(inner, watch, lambda: inner.round_id, needs=2)
    assert wrapped.all_reduce({}) == "result" and wrapped.round_id == 3  # delegates
    assert inner.seen is not None and inner.seen.round == 3 and watch.waiting is None
    watch.last_step = time.monotonic() - 10.0  # no step for 10 s: in a round that does not form
    watch.waiting = Waiting("round", 3, time.monotonic() - 10.0, 2)
    watch.start()
    try:
        assert spoke.wait(5.0)
    finally:
        watch.close()
    assert lines[0].startswith("waiting for peers: 1 of >= 2 for round 3, 2 live (")
    watch.stepped()
    assert watch.waiting is None
