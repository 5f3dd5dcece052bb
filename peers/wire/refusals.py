"""Log-once for refused messages: one INFO line per sender and round, the rest at DEBUG.

A flood of refused messages from one sender must not flood the log; the memory of what was logged
is bounded (:data:`LOGGED_MAX` entries) and cleared at each new round.
"""

from __future__ import annotations

import logging

__all__ = ["RefusalLog", "LOGGED_MAX"]

logger = logging.getLogger("peers.rounds.collective")  # the lines keep the collective's logger name
LOGGED_MAX = 4096  # (sender, round) refusals remembered


class RefusalLog:
    """Which (sender, round) refusals were logged already."""

    def __init__(self) -> None:
        self._logged: set[tuple[str, int]] = set()

    def reset(self) -> None:
        """A new round: log each sender's first refusal again."""
        self._logged = set()

    def log(self, sender: str, round_id: int, err: object) -> None:
        """Log a refusal once per sender and round (a flood must not flood the log)."""
        key = (sender, round_id)
        if key in self._logged or len(self._logged) >= LOGGED_MAX:
            logger.debug("refused a message from %s: %s", sender[:16], err)
            return
        self._logged.add(key)
        logger.info("refused a message from %s (round %d): %s", sender[:16], round_id, err)
