"""A volunteer's streak of failed rounds: when to say why, and when to give up."""

from __future__ import annotations

import logging
import time
from collections import Counter

from swarmtrain.core.errors import SwarmError

logger = logging.getLogger(__name__)


class RoundsKeepFailing(SwarmError):
    """A volunteer's rounds kept failing (``Membership.give_up_after`` seconds, none committed)."""


#: consecutive failed rounds after which their reason is logged at normal verbosity
SAY_AFTER = 3


class FailureStreak:
    """Consecutive failed rounds: says why after :data:`SAY_AFTER` of them (a warning, so a volunteer
    sees it without ``-v``), and gives up after ``give_up_after`` seconds without a commit, naming
    the streak's most common reason (the last round may end in a race that hides the cause)."""

    def __init__(self, give_up_after: float) -> None:
        self.give_up_after = give_up_after
        self.count = 0
        self.since = 0.0
        self.reasons: Counter[str] = Counter()

    def committed(self) -> None:
        self.count = 0
        self.reasons.clear()

    def failed(self, reason: str) -> None:
        """Count one failed round; raise :class:`RoundsKeepFailing` once they lasted too long."""
        now = time.monotonic()
        if self.count == 0:
            self.since = now
        self.count += 1
        why = reason or "no reason given"
        self.reasons[why] += 1
        if self.count == SAY_AFTER:
            logger.warning("%d rounds in a row failed; the last: %s", self.count, why)
        if self.give_up_after and now - self.since >= self.give_up_after:
            common, times = self.reasons.most_common(1)[0]
            which = "the last failure" if times == 1 else f"{times} of them"
            raise RoundsKeepFailing(
                f"no round committed in {now - self.since:.0f} s ({self.count} failed); "
                f"{which}: {why if times == 1 else common}"
            )
