"""Preemption hand-off with real ``swarmtrain join`` processes on 127.0.0.1 (issue 14, point 3).

Four volunteers train; two of them (c, d) are frozen (SIGSTOP of their process groups: a peer that
fell behind) and the other two (a, b) are preempted (SIGTERM) together. a and b hold the run's newest
committed state and nobody that stays does: they must keep serving it until a peer that stays has
taken it, then exit 0 within their grace. Unfrozen, c and d find the state of a's and b's last
committed round, download it and go on committing rounds together from it. Without the hand-off a
and b leave at once and the rounds they committed leave with them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from test_rejoin import COMMITTED, _Run

from peers import find_orphans

#: the volunteers' peers.preempt_grace: more than the default 25 s, whose train-on to the next sync
#: can leave the hand-off under 5 s on two loaded cores (the steps slow down after the signal, and a
#: sync estimated at ~3 s came 6.5 s later); this test is about the hand-off, not that margin
GRACE = 40.0
WAITING = "preemption: serving round"
HELD = "preemption: peers that stay hold"


def _commits(run: _Run, name: str) -> list[int]:
    return [int(r) for r in re.findall(COMMITTED, run.log(name))]


def _wait_for(run: _Run, name: str, text: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in run.log(name):
        assert time.monotonic() < deadline, run.log(name)[-3000:]
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_preempted_peers_hand_the_committed_state_to_the_peers_that_stay(tmp_path: Path) -> None:
    from peers.keys.identity import ensure_identity

    run = _Run(tmp_path, {"SWARMTRAIN_PEERS__PREEMPT_GRACE": str(GRACE)})
    keys = {n: tmp_path / f"key_{n}" for n in "abcd"}
    for k in keys.values():
        ensure_identity(k)
    try:
        run.start_dht()
        procs = {n: run.join(n, keys[n]) for n in "abcd"}
        for n, p in procs.items():
            run.wait_commits(n, p, 1)
        # freeze c and d once both committed the same round (a frozen member of a round under way
        # would fail it for everyone: freeze them between rounds)
        deadline = time.monotonic() + 120
        while not (set(_commits(run, "c")) & set(_commits(run, "d"))) or max(_commits(run, "c")) != max(
            _commits(run, "d")
        ):
            assert time.monotonic() < deadline, (run.log("c")[-2000:], run.log("d")[-2000:])
            time.sleep(0.05)
        frozen_at = max(_commits(run, "c"))
        for n in "cd":
            os.killpg(procs[n].pid, signal.SIGSTOP)
        # signal a and b a step or so after their commit of that round too: a signal that lands on
        # the sync step itself leaves at once (no local work since the sync to contribute), with the
        # same state as c and d, and there is nothing to hand off
        for n in "ab":
            _wait_for(run, n, f"round {frozen_at} committed")
        time.sleep(1.0)
        for n in "ab":
            procs[n].signal(signal.SIGTERM)
        # a and b hold a newer state than any peer that stays: they wait for c and d to take it
        for n in "ab":
            _wait_for(run, n, WAITING)
        for n in "cd":
            os.killpg(procs[n].pid, signal.SIGCONT)
        for n in "ab":
            assert procs[n].join(GRACE + 15), run.log(n)[-3000:]
            assert procs[n].exitcode == 0, run.log(n)[-3000:]
            assert HELD in run.log(n), run.log(n)[-3000:]
        for n in "cd":  # the ones that stay go on committing rounds together
            run.wait_commits(n, procs[n], len(_commits(run, n)) + 1)
        left = run.stop({"c": procs["c"], "d": procs["d"]})
        gone = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab"}
    finally:
        for p in run.procs:
            try:
                os.killpg(p.pid, signal.SIGCONT)
            except OSError:
                pass
            p.terminate(grace=3.0)
    last = {n: max(int(r) for r in gone[n]["sync_digests"]) for n in "ab"}
    assert last["a"] == last["b"] and last["a"] >= frozen_at
    newest = gone["a"]["sync_digests"][str(last["a"])]
    assert gone["b"]["sync_digests"][str(last["b"])] == newest
    for n in "cd":
        res = left[n]
        # it took the state of the round the preempted peers committed last, from them
        assert any(dl["digest"] == newest for dl in res["downloads"]), (res["downloads"], newest)
        assert any(int(r) > last["a"] for r in res["sync_digests"]), res["sync_digests"]
    common = set(left["c"]["sync_digests"]) & set(left["d"]["sync_digests"])
    assert common and all(left["c"]["sync_digests"][r] == left["d"]["sync_digests"][r] for r in common)
    assert not [o for p in run.procs for o in find_orphans(p.marker)]
