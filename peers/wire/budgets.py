"""Budgets on what a peer serves: a byte rate (:class:`TokenBucket`) and bytes per requester per
window (:class:`RequesterBudget`).

A donor's upload cap (:class:`TokenBucket`, ``peers.state.state_chunks``) is shared by all requests, so one
identity asking again and again takes the whole of it and real newcomers starve. A
:class:`RequesterBudget` gives each requester at most ``per_requester`` bytes per ``window_s``
seconds, and all requesters together at most ``total`` bytes (``0``: no total), counted in fixed
windows that start at a requester's first request. It tracks at most ``max_requesters`` requesters
(the oldest window is forgotten first), so a crowd of identities costs bounded memory.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["RequesterBudget", "TokenBucket"]


class RequesterBudget:
    """Bytes each requester may take per window (see the module docstring).

    Args:
        per_requester: bytes one requester may take per window.
        total: bytes all requesters together may take per window (``<= 0``: no total).
        window_s: the window, in seconds.
        max_requesters: requesters tracked at once.
        clock: monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        per_requester: float,
        total: float = 0.0,
        window_s: float = 60.0,
        max_requesters: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_requester, self.total, self.window_s = float(per_requester), float(total), float(window_s)
        self.max_requesters, self.clock = max_requesters, clock
        self._used: OrderedDict[str, tuple[float, float]] = OrderedDict()  # peer -> (window start, bytes)
        self._all = (clock(), 0.0)
        self._lock = threading.Lock()
        self.refused = 0

    def take(self, peer: str, n: int, limit: float | None = None) -> bool:
        """Count ``n`` bytes for ``peer`` and return True, or return False (nothing counted) when they
        would exceed its share this window (``limit``: its share this time, default ``per_requester``)."""
        cap = self.per_requester if limit is None else float(limit)
        now = self.clock()
        with self._lock:
            start, used = self._used.get(peer, (now, 0.0))
            if now - start >= self.window_s:
                start, used = now, 0.0
            t0, everyone = self._all
            if now - t0 >= self.window_s:
                t0, everyone = now, 0.0
            if used + n > cap or (self.total > 0 and everyone + n > self.total):
                self.refused += 1
                return False
            self._used[peer] = (start, used + n)
            self._used.move_to_end(peer)
            while len(self._used) > self.max_requesters:
                self._used.popitem(last=False)
            self._all = (t0, everyone + n)
            return True

    def used(self, peer: str) -> float:
        """Bytes ``peer`` took in its current window."""
        with self._lock:
            start, used = self._used.get(peer, (0.0, 0.0))
            return used if self.clock() - start < self.window_s else 0.0


class TokenBucket:
    """A byte-rate limit: ``rate`` bytes/s with bursts of ``burst`` bytes (``rate <= 0``: none).

    :meth:`reserve` takes ``n`` bytes now (the balance may go negative) and says how long the caller
    must wait before sending them; callers that reserve one after another queue up behind each other.
    """

    def __init__(self, rate: float, burst: float, clock: Any = time.monotonic) -> None:
        self.rate, self.burst, self.clock = float(rate), float(burst), clock
        self.tokens = float(burst)
        self._t = clock()

    def reserve(self, n: int) -> float:
        if self.rate <= 0:
            return 0.0
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self._t) * self.rate) - n
        self._t = now
        return max(0.0, -self.tokens / self.rate)

    async def acquire(self, n: int) -> None:
        wait = self.reserve(n)
        if wait > 0:
            await asyncio.sleep(wait)
