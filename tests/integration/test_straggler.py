"""A straggler 10x slower than the others, with real ``swarmtrain join`` processes on 127.0.0.1
(issue 14, point 5: adaptive deadlines).

The straggler's main process is throttled by the test (SIGCONT for 0.1 s, SIGSTOP for 0.9 s: it
computes at a tenth of the speed; its DHT helper and p2pd run on). The hand-set join window is a
generous 6 s, a first guess for a slow network. The fast peers must neither wait that window for the
straggler every round (their leader's measured window falls below it once it has two rounds of
arrivals) nor be dropped (no round goes on without one of them); the straggler is left out of the
rounds it misses and catches up with the state they commit, so nothing stalls.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from test_rejoin import _Run

from peers import find_orphans

CEILING = 6.0
WINDOW = r"round (\d+) committed \((\d+) peers; join window ([\d.]+) s[;)]"


def _throttle(pid: int, stop: threading.Event, run_s: float = 0.1, period_s: float = 1.0) -> None:
    """Let ``pid`` run ``run_s`` of every ``period_s`` seconds until ``stop``, then let it run."""
    try:
        while not stop.is_set():
            os.kill(pid, signal.SIGCONT)
            time.sleep(run_s)
            os.kill(pid, signal.SIGSTOP)
            stop.wait(period_s - run_s)
    except ProcessLookupError:
        return
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_straggler_neither_holds_the_rounds_open_nor_gets_the_fast_peers_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peers.keys.identity import ensure_identity

    monkeypatch.setenv("SWARMTRAIN_PEERS__JOIN_WINDOW", str(CEILING))
    run = _Run(tmp_path)
    keys = {n: tmp_path / f"key_{n}" for n in ("a", "b", "s")}
    for k in keys.values():
        ensure_identity(k)
    stop = threading.Event()
    throttle: threading.Thread | None = None
    try:
        run.start_dht()
        procs = {n: run.join(n, keys[n]) for n in keys}
        for n in ("a", "b"):
            run.wait_commits(n, procs[n], 1)
        throttle = threading.Thread(target=_throttle, args=(procs["s"].pid, stop), daemon=True)
        throttle.start()
        # the fast peers commit rounds together while the straggler crawls
        for n in ("a", "b"):
            run.wait_commits(n, procs[n], 5)
        stop.set()
        throttle.join(5)
        ends = run.stop(procs)
    finally:
        stop.set()
        for p in run.procs:
            p.terminate(grace=3.0)
    logs = {n: re.findall(WINDOW, run.log(n)) for n in ("a", "b")}
    # the leader's measured window fell below the hand-set window, which a non-leader (it measures
    # nothing) keeps; which of the two led round 0 is a race, so neither is assumed to be first
    windows = [float(w) for n in ("a", "b") for _, _, w in logs[n]]
    assert CEILING in windows and min(windows) < CEILING, logs
    # no fast peer was dropped: every round they committed after the throttle had both of them
    rounds = {n: {int(r) for r, _, _ in logs[n]} for n in ("a", "b")}
    assert rounds["a"] == rounds["b"], rounds
    for n in ("a", "b"):
        assert ends[n]["late_rounds"] == 0, run.log(n)[-3000:]
    # the straggler was left out of rounds and caught up with what they committed, same parameters
    s = ends["s"]
    assert s["late_rounds"] >= 1 and s["downloads"], run.log("s")[-3000:]
    digests = set(ends["a"]["sync_digests"].values())
    assert any(dl["digest"] in digests for dl in s["downloads"]), (s["downloads"], digests)
    assert not [o for p in run.procs for o in find_orphans(p.marker)]
