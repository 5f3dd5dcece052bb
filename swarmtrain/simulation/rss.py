"""Resident memory of a simulated peer over its run (``honest_rss_growth_mib``)."""

from __future__ import annotations

import threading

__all__ = ["RssWatch"]


class RssWatch:
    """Samples this process's resident set size every ``interval`` seconds from :meth:`start` until
    :meth:`stop`; :attr:`growth_mib` is the highest sample minus the first one (what the run added on
    top of the memory it had once training began).
    """

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.first = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Take the first sample now and keep sampling in a daemon thread (a second call does nothing)."""
        if self._thread is not None:
            return
        self.first = self.peak = self._rss()
        self._thread = threading.Thread(target=self._run, name="rss-watch", daemon=True)
        self._thread.start()

    def stop(self) -> float:
        """Stop sampling (one last sample); returns :attr:`growth_mib`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self.peak = max(self.peak, self._rss())
        return self.growth_mib

    @property
    def growth_mib(self) -> float:
        return max(self.peak - self.first, 0) / (1 << 20) if self._thread is not None else 0.0

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._rss())

    @staticmethod
    def _rss() -> int:
        import psutil

        return int(psutil.Process().memory_info().rss)
