"""Deadlines of SWARM requests from measured service times (no hand-set timeout once measured).

A trainer records how long each successful request to a stage took (per stage and kind: forward,
backward). The deadline of the next request is ``slack`` times a high quantile of the recent
durations, scaled by the chosen server's queue: a request waits behind ``queue`` others. Until
``min_samples`` durations are known, the first-contact deadline applies (model load, first
compilation and connection set-up make the first calls slow). A request that timed out counts as a
duration equal to its deadline, so a machine that slows down widens its deadlines instead of
excluding every server in turn.

Pure: the caller passes durations in seconds.
"""

from __future__ import annotations

import math
from collections import deque

from swarmtrain.core.errors import ConfigError

__all__ = ["ServiceTimes"]


class ServiceTimes:
    """Recent request durations per (stage, kind) and the deadlines derived from them.

    Args:
        first_contact: deadline in seconds while fewer than ``min_samples`` durations are known.
        slack: multiple of the quantile a request may take.
        quantile: which quantile of the recent durations (0.9: the slow tail, not the worst).
        window: durations kept per (stage, kind).
        min_samples: durations needed before measured deadlines apply.
        floor: smallest deadline, seconds (scheduler noise on a loaded machine).
    """

    def __init__(
        self,
        *,
        first_contact: float = 60.0,
        slack: float = 3.0,
        quantile: float = 0.9,
        window: int = 32,
        min_samples: int = 3,
        floor: float = 0.25,
    ) -> None:
        if not first_contact > 0 or not slack >= 1 or not 0 < quantile <= 1:
            raise ConfigError("need first_contact > 0, slack >= 1 and quantile in (0, 1]")
        if window < 1 or min_samples < 1 or min_samples > window or not floor > 0:
            raise ConfigError("need 1 <= min_samples <= window and floor > 0")
        self.first_contact = float(first_contact)
        self.slack = float(slack)
        self.quantile = float(quantile)
        self.window = window
        self.min_samples = min_samples
        self.floor = float(floor)
        self._times: dict[tuple[int, str], deque[float]] = {}

    def record(self, stage: int, kind: str, seconds: float) -> None:
        """Record the duration of one request (a timed-out one: its deadline)."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        self._times.setdefault((stage, kind), deque(maxlen=self.window)).append(float(seconds))

    def measured(self, stage: int, kind: str) -> float | None:
        """The ``quantile`` of the recent durations, or ``None`` before ``min_samples`` of them."""
        times = self._times.get((stage, kind))
        if times is None or len(times) < self.min_samples:
            return None
        ordered = sorted(times)
        return ordered[min(len(ordered) - 1, math.ceil(self.quantile * len(ordered)) - 1)]

    def deadline(self, stage: int, kind: str, queue: int = 0) -> float:
        """Seconds the next request to a server of ``stage`` with ``queue`` waiting requests gets."""
        q = self.measured(stage, kind)
        if q is None:
            return self.first_contact
        return min(self.first_contact, max(self.floor, self.slack * q * (1 + max(0, queue))))
