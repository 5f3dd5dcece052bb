"""A background thread that reads the run's records every ``interval`` seconds into a :class:`History`.

The reading itself is a callable (``read() -> (records, bans)``), so the thread knows nothing of the
DHT and tests drive it with canned records. A failed read is noted on the history (the page shows
it) and retried at the next interval; the thread never dies of one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from peers.dht.records import PeerRecord
from swarmtrain.app.dashboard.history import History

__all__ = ["Poller", "Reader"]

logger = logging.getLogger(__name__)

Reader = Callable[[], tuple[list[PeerRecord], dict[str, str]]]


class Poller:
    """Calls ``read`` every ``interval`` seconds and folds the result into ``history``.

    Args:
        read: returns the live peer records and the bans (peer -> reason).
        history: where the polls go.
        interval: seconds between the end of one read and the start of the next.
        clock: wall-clock time source (``time.time``; the records' times are DHT times, the same).
    """

    def __init__(
        self,
        read: Reader,
        history: History,
        interval: float,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not interval > 0:
            raise ValueError("the poll interval must be > 0 seconds")
        self.read = read
        self.history = history
        self.interval = interval
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> bool:
        """One read folded into the history; False (and the error noted) if the read failed."""
        try:
            records, bans = self.read()
        except Exception as e:  # the DHT may not answer one poll; the next may
            logger.info("dashboard poll failed: %s: %s", type(e).__name__, e)
            self.history.note_error(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__, self.clock())
            return False
        self.history.update(records, bans, self.clock())
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            self._stop.wait(self.interval)

    def start(self) -> None:
        """Start polling in a daemon thread (the first poll at once)."""
        if self._thread is not None:
            raise RuntimeError("the poller is already started")
        self._thread = threading.Thread(target=self._run, name="swarmtrain-dashboard-poll", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the thread to stop and wait up to ``timeout`` seconds for a read in flight."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
