"""No process outlives its parent.

A peer: SIGKILL of its main process, and a process-group kill of a live peer. hivemind's DHT child and
p2pd would outlive a SIGKILLed main process (docs/architecture.md, Known traps); two defences are checked: the
node's watchdog inside the DHT process (helpers exit by themselves when the main process dies) and
``kill_group`` on a peer started in its own session.

The CLIs: SIGKILL of the ``simulate``, ``join`` and ``dht`` process itself (real subprocesses); every
process of its tree (peers, bootstrap, DHT helpers, p2pd daemons, the resource tracker) must be gone
5 s later. The tree is found by an environment tag every descendant inherits, and by the PIDs seen
before the kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from peer_helpers import LOOP, loopback_config, report, reporting_errors
from peer_helpers import SWARMTRAIN as SW
from test_join import _env, _start_dht

from peers.dht.process import (
    PeerProcess,
    find_orphans,
    kill_group,
    process_context,
    spawn_command,
    spawn_function,
)

#: what the issue allows an orphan (5 s), plus a margin for polling on a loaded machine
ORPHAN_LIMIT_S = 5.0
POLL_MARGIN_S = 2.0
TREE_ENV = "ORPHAN_TEST_TREE"  # not SWARMTRAIN_*: the config reads those


def idle_peer(q: Any, rank: int) -> None:
    from peers import PeerNode

    with reporting_errors(q, rank), PeerNode(loopback_config("t-orphan")) as node:
        report(q, "ready", rank, node.peer_id)
        time.sleep(600)


def _helpers(marker: str, main_pid: int) -> list[str]:
    return [" ".join(p.cmdline()[:1]) for p in find_orphans(marker) if p.pid != main_pid and p.is_running()]


def test_no_orphans_after_sigkill_or_group_kill() -> None:
    q = process_context().Queue()
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


# ---------------------------------------------------------------------------- the CLI parents


def _alive(p: Any) -> bool:
    import psutil

    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _tree(tag: str, pids: set[int], skip: int) -> list[Any]:
    """Live processes that carry ``tag`` in their environment or whose PID is in ``pids`` (all
    seen before the kill), except ``skip`` (the killed parent, a zombie until the test reaps it)."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid"]):
        if p.pid in (skip, os.getpid()) or not _alive(p):
            continue
        try:
            if p.pid in pids or p.environ().get(TREE_ENV) == tag:
                out.append(p)
        except psutil.Error:
            continue
    return out


def _describe(procs: list[Any]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline()[:3])[:80]}")
        except Exception:
            out.append(str(p.pid))
    return out


def _start(argv: list[str], tmp: Path, name: str, tag: str) -> PeerProcess:
    env = _env()
    env[TREE_ENV] = tag
    env["SWARMTRAIN_PEERS__OPEN_UNPROTECTED"] = "true"  # an open run with the mean, on loopback
    out = (tmp / f"{name}.out").open("w")
    return spawn_command(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait_for_p2pd(proc: PeerProcess, tmp: Path, name: str, n: int, timeout: float = 180.0) -> set[int]:
    """Wait until ``proc``'s tree runs ``n`` p2pd daemons; return the PIDs of its tree."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        assert proc.alive, (tmp / f"{name}.out").read_text()[-2000:]
        kids = psutil.Process(proc.pid).children(recursive=True)
        daemons = [k for k in kids if _alive(k) and "p2pd" in " ".join(k.cmdline()[:1])]
        if len(daemons) >= n:
            return {k.pid for k in kids}
        assert time.monotonic() < deadline, f"{name}: {len(daemons)} of {n} p2pd daemons came up"
        time.sleep(0.3)


def _kill_and_check(proc: PeerProcess, tag: str, pids: set[int]) -> float:
    """SIGKILL ``proc`` alone (not its group); assert nothing of its tree lives after the limit.
    Returns the seconds until the tree was gone."""
    t0 = time.monotonic()
    proc.signal(signal.SIGKILL)
    left = _tree(tag, pids, proc.pid)
    while left and time.monotonic() - t0 < ORPHAN_LIMIT_S + POLL_MARGIN_S:
        time.sleep(0.1)
        left = _tree(tag, pids, proc.pid)
    took = time.monotonic() - t0
    assert proc.join(5)
    assert not left, f"alive {took:.1f} s after SIGKILL of the parent: {_describe(left)}"
    return took


def _cleanup(tag: str, procs: list[PeerProcess]) -> None:
    for p in procs:
        p.terminate(grace=1.0)
    for o in _tree(tag, set(), -1):
        try:
            o.kill()
        except Exception:
            pass


@pytest.mark.timeout(300)
def test_dht_and_join_leave_nothing_after_sigkill(tmp_path: Path) -> None:
    """SIGKILL of a ``join`` volunteer's process while it trains, then of the ``dht`` node's."""
    run, dht_tag, join_tag = "orphanjoin", uuid.uuid4().hex, uuid.uuid4().hex
    procs: list[PeerProcess] = []
    try:
        os.environ[TREE_ENV] = dht_tag  # _start_dht builds its env from ours
        try:
            dht, maddr = _start_dht(tmp_path, run)
        finally:
            os.environ.pop(TREE_ENV, None)
        procs.append(dht)
        argv = [*SW, "join", "--initial-peers", maddr, "--run-id", run, *LOOP, "-s", "diloco"]
        join = _start([*argv, "--steps", "100000"], tmp_path, "join", join_tag)
        procs.append(join)
        join_pids = _wait_for_p2pd(join, tmp_path, "join", 1)
        time.sleep(3.0)  # into its training loop
        join_pids |= _wait_for_p2pd(join, tmp_path, "join", 1)
        took = _kill_and_check(join, join_tag, join_pids)
        assert dht.alive  # the other tree is untouched
        print(f"join tree gone {took:.1f} s after SIGKILL")
        dht_pids = _wait_for_p2pd(dht, tmp_path, "dht", 1)
        took = _kill_and_check(dht, dht_tag, dht_pids)
        print(f"dht tree gone {took:.1f} s after SIGKILL")
    finally:
        _cleanup(dht_tag, procs)
        _cleanup(join_tag, [])


@pytest.mark.timeout(300)
def test_simulate_leaves_nothing_after_sigkill(tmp_path: Path) -> None:
    """SIGKILL of ``swarmtrain simulate`` while its peers train: its bootstrap node, peers, their DHT
    helpers and p2pd daemons, and its resource tracker all go."""
    tag = uuid.uuid4().hex
    argv = [*SW, "simulate", "--peers", "2", "--steps", "100000", "--timeout", "600"]
    sim = _start(argv, tmp_path, "simulate", tag)
    try:
        pids = _wait_for_p2pd(sim, tmp_path, "simulate", 3)  # the bootstrap's and one per peer
        time.sleep(2.0)
        pids |= _wait_for_p2pd(sim, tmp_path, "simulate", 3)
        took = _kill_and_check(sim, tag, pids)
        print(f"simulate tree ({len(pids)} processes) gone {took:.1f} s after SIGKILL")
    finally:
        _cleanup(tag, [sim])
