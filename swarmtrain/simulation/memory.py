"""The memory a simulated run holds: the JSON's ``peak_rss_total_mib`` and ``rss_per_peer_mib``.

Peers are forked from one fork server that imported torch, so their resident sets share pages: the
sum of their RSS counts torch once per process and overstates what the machine holds. Every figure
here is the proportional set size (PSS, Linux's ``/proc/PID/smaps_rollup``): each resident page
counted once, split among the processes that share it, so the per-process figures add up to the
machine's. Where PSS cannot be read (not Linux), RSS stands in (an overstatement).

* ``rss_per_peer_mib``: per rank, the peak over the run of its process tree (the peer, its DHT
  helper and its p2pd; of whichever incarnation of a restarted rank ran at each sample), averaged
  over the ranks;
* ``peak_rss_total_mib``: the peak of this process and every process under it (the fork server,
  the bootstrap node, the peers, intruders and colluders): what the command needs.

A sampler thread (:class:`RunMemory`) reads them every :data:`SAMPLE_S` seconds while the peers run,
each process once per sample; reading a process's PSS walks its page tables (about 8 ms of CPU for
a 400 MiB peer), so with many peers the thread waits longer between samples, to stay under
:data:`MAX_SHARE` of one core. The share counts the sample's CPU time, not its wall time: on a
machine the peers keep busy, a sample's wall time is mostly waiting for a core, and pacing by it
left a 32-peer run with a few samples taken before the peers had started (198 MiB per peer against
394 sampled every 2 s).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping

__all__ = ["SAMPLE_S", "MAX_SHARE", "RunMemory", "pss_bytes", "tree_pss_bytes"]

#: seconds between two samples, at least
SAMPLE_S = 2.0
#: the most of one core the sampler takes: it waits until a sample's CPU time is this share
MAX_SHARE = 0.1
_MIB = 1 << 20


def pss_bytes(pid: int) -> int:
    """Process ``pid``'s proportional set size in bytes (RSS where PSS is unreadable); 0 when the
    process is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def _tree(pid: int) -> list[int]:
    """Process ``pid`` and every process under it (empty when it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [pid, *(p.pid for p in root.children(recursive=True))]
    except psutil.Error:
        return []


def tree_pss_bytes(pid: int, known: Mapping[int, int] | None = None) -> int:
    """PSS of process ``pid`` and every process under it, in bytes (0 when it is gone); ``known``:
    PSS already read, by PID."""
    known = known or {}
    return sum(known[p] if p in known else pss_bytes(p) for p in _tree(pid))


class RunMemory:
    """Samples the memory of a run's processes from :meth:`start` until :meth:`stop` (or over a
    ``with`` block).

    Args:
        ranks: returns, when called, rank -> PID of that rank's current peer process (the ranks
            running now).
        interval: seconds between samples.
    """

    def __init__(self, ranks: Callable[[], Mapping[int, int]], interval: float = SAMPLE_S) -> None:
        self._ranks = ranks
        self.interval = interval
        self.peak_total = 0  # bytes
        self.peak_by_rank: dict[int, int] = {}  # bytes
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RunMemory:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="run-memory", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop sampling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)

    def sample(self) -> None:
        """One sample of the whole run and of every rank's tree (each process read once)."""
        pss = {p: pss_bytes(p) for p in _tree(os.getpid())}
        self.peak_total = max(self.peak_total, sum(pss.values()))
        for rank, pid in dict(self._ranks()).items():
            self.peak_by_rank[rank] = max(self.peak_by_rank.get(rank, 0), tree_pss_bytes(pid, pss))

    def _run(self) -> None:
        while True:
            cpu0 = time.thread_time()
            try:
                self.sample()
            except Exception:  # a measurement never takes the run down
                pass
            if self._stop.wait(max(self.interval, (time.thread_time() - cpu0) / MAX_SHARE)):
                return

    @property
    def per_peer_mib(self) -> float:
        """The ranks' peak tree PSS, averaged over the ranks (0.0 before any sample)."""
        peaks = list(self.peak_by_rank.values())
        return sum(peaks) / len(peaks) / _MIB if peaks else 0.0

    @property
    def total_mib(self) -> float:
        return self.peak_total / _MIB
