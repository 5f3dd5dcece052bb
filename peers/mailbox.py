"""The receive side of the collective: a bounded, thread-safe buffer of messages per round.

The stream handler runs on the node's event loop and only *stores* what arrives (after bounds checks)
so the loop never blocks on codec work; the calling thread of ``all_reduce``/``all_gather`` waits on
the mailbox with a deadline and decodes. Messages may arrive before their receiver has even formed the
round (a faster peer), so rounds slightly ahead are buffered; older rounds are refused and purged, and
the total buffered bytes are capped, so a peer cannot grow our memory without bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from peers.messages import Envelope
from swarmtrain.core.errors import ProtocolError

__all__ = ["Mailbox", "Delivery", "Key"]

Key = tuple[str, str, int]  # (message type, sender, chunk)
AHEAD_ROUNDS = 32  # rounds past the current one that may be buffered


@dataclass(frozen=True)
class Delivery:
    """One received message: who sent it (libp2p-authenticated peer ID), its header and data frames
    (``bytearray`` when read by ``peers.framereader``; treat them as read-only bytes)."""

    sender: str
    env: Envelope
    frames: tuple[bytes, ...]

    @property
    def nbytes(self) -> int:
        """Payload bytes of the data frames."""
        return sum(len(f) for f in self.frames)


class Mailbox:
    """Messages keyed by ``(kind, round)`` then ``(type, sender, chunk)``.

    Args:
        max_bytes: cap on the payload bytes buffered across all rounds.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._cond = threading.Condition()
        self._slots: dict[tuple[str, int], dict[Key, Delivery]] = {}
        self._bytes = 0
        self._floor = 0  # rounds below this are over

    def set_floor(self, round_id: int) -> None:
        """Rounds ``< round_id`` are finished: drop their messages and refuse new ones."""
        with self._cond:
            self._floor = max(self._floor, round_id)
            for key in [k for k in self._slots if k[1] < self._floor]:
                for d in self._slots.pop(key).values():
                    self._bytes -= d.nbytes

    def put(self, d: Delivery) -> None:
        """Store a delivery (handler side).

        Raises:
            ProtocolError: round outside the accepted window, duplicate, or buffer full.
        """
        with self._cond:
            r = d.env.round
            if r < self._floor or r > self._floor + AHEAD_ROUNDS:
                raise ProtocolError(f"round {r} outside the accepted window from {self._floor}")
            slot = self._slots.setdefault((d.env.kind, r), {})
            key = (d.env.type, d.sender, d.env.chunk)
            if key in slot:
                raise ProtocolError(f"duplicate {d.env.type} message for round {r}")
            if self._bytes + d.nbytes > self.max_bytes:
                raise ProtocolError("receive buffer full")
            slot[key] = d
            self._bytes += d.nbytes
            self._cond.notify_all()

    def wait(
        self,
        kind: str,
        round_id: int,
        ready: Callable[[dict[Key, Delivery]], bool],
        deadline: float,
    ) -> dict[Key, Delivery] | None:
        """Block until ``ready(slot)`` holds for the round's messages or ``deadline`` (monotonic) passes.

        Returns:
            a snapshot of the round's messages, or ``None`` on timeout.
        """
        with self._cond:
            while True:
                slot = dict(self._slots.get((kind, round_id), {}))
                if ready(slot):
                    return slot
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 1.0))

    def snapshot(self, kind: str, round_id: int) -> dict[Key, Delivery]:
        """The round's messages received so far."""
        with self._cond:
            return dict(self._slots.get((kind, round_id), {}))

    @property
    def buffered_bytes(self) -> int:
        """Payload bytes currently held."""
        with self._cond:
            return self._bytes
