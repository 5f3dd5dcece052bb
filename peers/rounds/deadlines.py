"""Adaptive deadlines: join windows and round timeouts from measured times.

Hand-set values (``peers.join_window``, a strategy's ``sync_timeout``) are first guesses and hard
ceilings. Once a few rounds were measured, a round's leader closes the round after

    clamp(margin * (median + k * MAD'), floor, ceiling)   of the recent *arrival offsets*,

where an arrival offset is how long after the leader's own arrival it first saw a member it took in
(one sample per member and round, the leader's own 0 included), and MAD' = 1.4826 * MAD is the
median absolute deviation scaled to a normal sigma: a straggler that is one member of three is a
third of the samples, which the median and the MAD ignore. The floor is at least half the hand-set
window: a peer that was late once catches up by downloading the state the round committed and then
arrives behind the others by about that download, so a window shorter than that would make it late
again every round (it would never take part in the rounds it keeps catching up with).

A round's timeout is likewise ``clamp(margin * (median + k * MAD'), floor, ceiling)`` of the recent
durations of whole rounds (formation to commit). A straggler 10x slower than the others thus stays
out of the rounds it misses (it is *late* and catches up with the state those rounds commit) instead
of holding every round open for a whole hand-set window, and the fast peers' own arrivals set the
window, so none of them is dropped.

A round that fails on its deadline counts as a duration of its whole timeout (a censored sample), so
timeouts that were set too tight widen again instead of failing forever. All estimates keep only the
last ``history`` samples: the run may change speed (another peer joins, the network slows down).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["DeadlineConfig", "Deadlines", "robust_bound"]

#: scales a median absolute deviation to the standard deviation of a normal distribution
MAD_SCALE = 1.4826


def robust_bound(samples: list[float], k: float) -> float:
    """``median + k * 1.4826 * MAD`` of ``samples`` (non-empty, finite)."""
    if not samples:
        raise ValueError("no samples")
    med = statistics.median(samples)
    mad = statistics.median(abs(x - med) for x in samples)
    return med + k * MAD_SCALE * mad


@dataclass(frozen=True)
class DeadlineConfig:
    """How deadlines adapt.

    Attributes:
        k: MADs above the median a bound sits.
        history: recent samples kept per estimate.
        min_samples: samples before an estimate replaces the first guess.
        join_floor: seconds below which a join window never goes.
        join_floor_fraction: ... nor below this fraction of the hand-set window.
        join_margin: a join window is this many times its spread bound.
        round_margin: a round's timeout is this many times its duration bound.
        round_floor: seconds below which a round timeout never goes, and never below a quarter of
            the hand-set timeout either.
    """

    k: float = 4.0
    history: int = 32
    min_samples: int = 2
    join_floor: float = 0.5
    join_floor_fraction: float = 0.5
    join_margin: float = 2.0
    round_margin: float = 2.0
    round_floor: float = 10.0

    def __post_init__(self) -> None:
        if not (self.k >= 0 and self.history >= 1 and 1 <= self.min_samples <= self.history):
            raise ValueError("need k >= 0 and 1 <= min_samples <= history")
        if not (self.join_floor > 0 and 0 <= self.join_floor_fraction <= 1 and self.round_floor > 0):
            raise ValueError("need join_floor > 0, 0 <= join_floor_fraction <= 1, round_floor > 0")
        if not (self.join_margin >= 1 and self.round_margin >= 1):
            raise ValueError("need join_margin >= 1 and round_margin >= 1")


class Deadlines:
    """The join window and round timeout of one peer's rounds, from what its rounds measured.

    Thread-safe (the collective observes from its calling thread; a status reader may look).

    Args:
        join_window: the hand-set join window: first guess and ceiling (seconds, > 0).
        config: how the estimates adapt (``None``: :class:`DeadlineConfig` defaults).
    """

    def __init__(self, join_window: float, config: DeadlineConfig | None = None) -> None:
        if not (join_window > 0 and math.isfinite(join_window)):
            raise ValueError("join_window must be finite and > 0")
        self.ceiling = join_window
        self.config = config or DeadlineConfig()
        self._spreads: deque[float] = deque(maxlen=self.config.history)
        self._rounds: deque[float] = deque(maxlen=self.config.history)
        self._lock = threading.Lock()
        #: ``time.monotonic()`` past which no round may run (a peer leaving within its grace), or None
        self.end_by: float | None = None

    def end_no_later_than(self, t: float | None) -> None:
        """Bring :attr:`end_by` forward to ``t`` (``time.monotonic()``; ``None``: no bound). Bounds
        only tighten: a preempted peer's grace and its token's expiry both hold."""
        if t is not None:
            self.end_by = t if self.end_by is None else min(self.end_by, t)

    @staticmethod
    def _sample(seconds: float) -> float:
        if not math.isfinite(seconds):
            raise ValueError("a measured time must be finite")
        return max(seconds, 0.0)

    def observe_arrivals(self, offsets_s: Iterable[float]) -> None:
        """A round this peer led closed; its members (itself included) arrived ``offsets_s`` seconds
        after it (0 for those already there), one sample each."""
        samples = [self._sample(x) for x in offsets_s]
        with self._lock:
            self._spreads.extend(samples)

    def observe_round(self, seconds: float) -> None:
        """A round took ``seconds`` from formation to commit (or failed on a deadline of ``seconds``)."""
        with self._lock:
            self._rounds.append(self._sample(seconds))

    def join_window(self) -> float:
        """Seconds a leader waits for joiners after its own arrival."""
        c = self.config
        with self._lock:
            spreads = list(self._spreads)
        if len(spreads) < c.min_samples:
            return self.ceiling
        floor = max(c.join_floor, c.join_floor_fraction * self.ceiling)
        return min(max(c.join_margin * robust_bound(spreads, c.k), floor), self.ceiling)

    def round_timeout(self, ceiling: float) -> float:
        """Seconds a whole round may take, the hand-set ``ceiling`` (a strategy's ``sync_timeout``)
        included as the first guess and the upper bound; never past :attr:`end_by` (at least 0.1 s)."""
        c = self.config
        with self._lock:
            rounds = list(self._rounds)
        t = ceiling
        if len(rounds) >= c.min_samples:
            floor = max(c.round_floor, ceiling / 4.0)
            t = min(max(c.round_margin * robust_bound(rounds, c.k), floor), ceiling)
        if self.end_by is not None:
            t = max(min(t, self.end_by - time.monotonic()), 0.1)
        return t
