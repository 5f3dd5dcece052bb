"""What a volunteer knows of its run while it trains, waits for a round or downloads: the live
trainers, the round the run is at, and what this peer is waiting for.

A daemon thread (:class:`RunWatch`) reads the run's peer records every :data:`WATCH_EVERY_S` seconds
(``node.live_peers``, the same records ``swarmtrain status`` reads) and keeps a :class:`RunView`:

* the live trainers, this one included (the live line's count, not the last round's members);
* the round the run is at (:func:`run_round`): the lower median of the rounds the other live,
  not-leaving trainers published. A restarted volunteer took its state (saved or downloaded) with
  the round number it was committed at; the peers that stayed may have moved on by rounds that
  failed without it (each call of the collective takes the next number, committed or not), and a
  peer in another round than the others never meets them: before this, a restarted volunteer and
  the one that stayed each ran rounds alone until they gave up. The loop moves its round number up
  to the run's (:meth:`RunView.ahead_of`) while it is not in step with the others. The median, not
  the maximum: one peer publishing a far-off round does not move the others.

While the training thread is inside a round or a download (no step for :data:`QUIET_S` seconds),
the watch calls ``on_wait`` with a :class:`Waiting` (what for, since when), so the live line says
``waiting for peers: 1 of >= 2 for round 0 (12s)`` instead of freezing on the last step's text.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from swarmtrain.core.errors import SwarmError

__all__ = ["RunView", "RunWatch", "Waiting", "run_round", "waiting_text", "WATCH_EVERY_S", "QUIET_S"]

logger = logging.getLogger(__name__)

#: seconds between two reads of the run's records
WATCH_EVERY_S = 3.0
#: seconds without a step after which the training thread counts as waiting (a round, a download)
QUIET_S = 2.0


def _trainers(records: Sequence[Any], own_id: str) -> list[Any]:
    """The other live trainers that are not leaving."""
    return [
        r
        for r in records
        if r.peer_id != own_id and r.role == "trainer" and not r.left and not r.extra.get("leaving")
    ]


def run_round(records: Sequence[Any], own_id: str) -> int | None:
    """The round the run is at by the other live trainers' records: the lower median of their
    published rounds (``None``: no other trainer)."""
    rounds = [int(r.round) for r in _trainers(records, own_id)]
    return statistics.median_low(rounds) if rounds else None


@dataclass(frozen=True)
class RunView:
    """The run as the last read of its records showed it."""

    trainers: int  # live trainers, this one included
    round: int | None  # the run's round (``run_round``), None: no other trainer
    at_round: dict[int, int]  # round -> live trainers whose record names it (this one excluded)
    read_at: float  # monotonic time of the read

    @classmethod
    def of(cls, records: Sequence[Any], own_id: str, now: float) -> RunView:
        others = _trainers(records, own_id)
        at: dict[int, int] = {}
        for r in others:
            at[int(r.round)] = at.get(int(r.round), 0) + 1
        return cls(len(others) + 1, run_round(records, own_id), at, now)

    def ahead_of(self, own_round: int) -> int | None:
        """The run's round when it is past ``own_round`` (this peer must move up to it), else None."""
        return self.round if self.round is not None and self.round > own_round else None


@dataclass(frozen=True)
class Waiting:
    """What the training thread waits for: a round (``round``, ``needs`` peers) or a state download."""

    what: str  # "round" or "state"
    round: int
    since: float  # monotonic
    needs: int = 2


def waiting_text(w: Waiting, view: RunView | None, now: float) -> str:
    """``waiting for peers: 1 of >= 2 for round 0 (12s)``: this peer and the live trainers whose
    record names the same round, of the ``needs`` a round needs; ``downloading the run's state (4s)``."""
    secs = f"{max(now - w.since, 0.0):.0f}s"
    if w.what == "state":
        return f"downloading the run's state ({secs})"
    here = 1 + (view.at_round.get(w.round, 0) if view is not None else 0)
    live = f", {view.trainers} live" if view is not None and view.trainers != here else ""
    return f"waiting for peers: {here} of >= {w.needs} for round {w.round}{live} ({secs})"


class RunWatch:
    """Reads the run's records in a daemon thread; tells ``on_wait`` while the trainer is stuck.

    Args:
        node: the peer's node (``live_peers``, ``peer_id``).
        on_wait: called with the waiting text every read while the training thread waits.
        every_s: seconds between reads.
    """

    def __init__(
        self, node: Any, on_wait: Callable[[str], None] | None, every_s: float = WATCH_EVERY_S
    ) -> None:
        self.node, self.on_wait, self.every_s = node, on_wait, every_s
        self.view: RunView | None = None
        self.waiting: Waiting | None = None
        self.last_step = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="swarmtrain-run-watch", daemon=True)

    def read(self, timeout: float = 5.0) -> RunView | None:
        """One read of the records now (the view is kept; None when the DHT did not answer)."""
        try:
            records = self.node.live_peers(timeout=timeout)
        except SwarmError as e:
            logger.debug("reading the run's records failed: %s", e)
            return self.view
        self.view = RunView.of(records, self.node.peer_id, time.monotonic())
        return self.view

    def stepped(self) -> None:
        """The training thread made a step (it is not waiting)."""
        self.last_step = time.monotonic()
        self.waiting = None

    def start(self) -> RunWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.read()
            w, now = self.waiting, time.monotonic()
            if w is not None and self.on_wait is not None and now - self.last_step >= QUIET_S:
                try:
                    self.on_wait(waiting_text(w, self.view, now))
                except Exception:  # a display problem must not end the watch
                    logger.debug("showing the waiting line failed", exc_info=True)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)  # a daemon: a read in flight need not hold the exit up


class WatchedCollective:
    """The collective the strategy talks through, telling ``watch`` which round it waits in.

    Implements ``Collective`` by delegation (every other attribute is the wrapped one's)."""

    def __init__(self, inner: Any, watch: RunWatch, round_of: Callable[[], int], needs: int) -> None:
        self._inner, self._watch, self._round_of, self._needs = inner, watch, round_of, needs

    def _call(self, name: str, *args: Any, **kw: Any) -> Any:
        self._watch.waiting = Waiting("round", self._round_of(), time.monotonic(), self._needs)
        try:
            return getattr(self._inner, name)(*args, **kw)
        finally:
            self._watch.waiting = None

    def all_reduce(self, *args: Any, **kw: Any) -> Any:
        return self._call("all_reduce", *args, **kw)

    def all_gather(self, *args: Any, **kw: Any) -> Any:
        return self._call("all_gather", *args, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
