"""``swarmtrain.simulation.memory``: the proportional set sizes behind ``rss_per_peer_mib``."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from swarmtrain.simulation.memory import RunMemory, pss_bytes, tree_pss_bytes

MIB = 1 << 20
#: a child that holds 64 MiB of its own (written, so resident) until it is killed
HOLDER = "import time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(60)"


def _holder() -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-c", HOLDER])
    deadline = time.monotonic() + 30
    while psutil.Process(child.pid).memory_info().rss < 64 * MIB:
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.05)
    return child


def test_pss_of_this_process_is_resident_and_at_most_its_rss() -> None:
    pss, rss = pss_bytes(psutil.Process().pid), psutil.Process().memory_info().rss
    assert 0 < pss <= rss * 1.01  # sampled a moment apart


def test_a_gone_process_holds_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert pss_bytes(child.pid) == 0 and tree_pss_bytes(child.pid) == 0


def test_a_tree_counts_its_children_and_a_rank_its_peak() -> None:
    child = _holder()
    try:
        own = tree_pss_bytes(child.pid)
        assert own >= 64 * MIB
        # this process's tree holds the child's 64 MiB on top of its own
        assert tree_pss_bytes(psutil.Process().pid) >= pss_bytes(psutil.Process().pid) + 64 * MIB
        mem = RunMemory(lambda: {0: child.pid}, interval=0.05)
        mem.start()
        time.sleep(0.3)
    finally:
        child.kill()
        child.wait()
    time.sleep(0.2)  # samples after the child is gone keep its peak
    mem.stop()
    assert mem.peak_by_rank == {0: mem.peak_by_rank[0]} and mem.peak_by_rank[0] >= 64 * MIB
    assert mem.per_peer_mib == mem.peak_by_rank[0] / MIB
    # the whole run: this process's tree, which held the child
    assert mem.total_mib * MIB > mem.peak_by_rank[0]
