"""No process outlives a peer: SIGKILL of its main process, and a process-group kill of a live peer.

hivemind's DHT child and p2pd would outlive a SIGKILLed main process (DESIGN.md section 8). Two
defences are checked: the node's watchdog inside the DHT process (helpers exit by themselves when the
main process dies) and ``kill_group`` on a peer started in its own session.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from typing import Any

from peer_helpers import loopback_config, report, reporting_errors

from peers.process import find_orphans, kill_group, spawn_function


def idle_peer(q: Any, rank: int) -> None:
    from peers import PeerNode

    with reporting_errors(q, rank), PeerNode(loopback_config("t-orphan")) as node:
        report(q, "ready", rank, node.peer_id)
        time.sleep(600)


def _helpers(marker: str, main_pid: int) -> list[str]:
    return [" ".join(p.cmdline()[:1]) for p in find_orphans(marker) if p.pid != main_pid and p.is_running()]


def test_no_orphans_after_sigkill_or_group_kill() -> None:
    q = mp.get_context("spawn").Queue()
    crashed = spawn_function(idle_peer, (q, 0))
    stopped = spawn_function(idle_peer, (q, 1))
    try:
        got = {q.get(timeout=120)[:2] for _ in range(2)}
        assert got == {("ready", 0), ("ready", 1)}
        for proc in (crashed, stopped):
            assert any("p2pd" in h for h in _helpers(proc.marker, proc.pid)), "expected a p2pd helper"

        # 1. SIGKILL of the main process only: the helpers notice and exit on their own
        crashed.signal(signal.SIGKILL)
        assert crashed.join(10) and crashed.exitcode == -signal.SIGKILL
        end = time.monotonic() + 15
        while find_orphans(crashed.marker) and time.monotonic() < end:
            time.sleep(0.2)
        assert find_orphans(crashed.marker) == [], _helpers(crashed.marker, crashed.pid)

        # 2. the whole process group of a live peer: SIGTERM, then SIGKILL after the grace period
        assert kill_group(stopped.pid, grace=5.0)
        assert stopped.join(5)
    finally:
        crashed.terminate(grace=1.0)
        stopped.terminate(grace=1.0)
    assert find_orphans(crashed.marker) == [] and find_orphans(stopped.marker) == []
