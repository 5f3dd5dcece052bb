"""The byte ledger: bytes sent and received per round and per kind, counted where they hit the stream.

Every bandwidth claim of swarmtrain comes from this ledger (docs/architecture.md, Byte ledger and Measurement
rules). The transport calls :meth:`ByteLedger.add_sent` / :meth:`ByteLedger.add_received` with the exact
number of bytes it wrote to / read from a libp2p stream (frame headers included), so the figures are what the
link carried above libp2p, not an estimate from tensor sizes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from swarmtrain.core.errors import ConfigError

__all__ = ["ByteLedger", "LedgerEntry", "STATE_ROUND"]

# Round key used for traffic that belongs to no collective round (state download, heartbeats).
STATE_ROUND = -1


@dataclass
class LedgerEntry:
    """Bytes of one (kind, round) cell."""

    sent: int = 0
    received: int = 0

    def as_dict(self) -> dict[str, int]:
        """``{"sent": ..., "received": ...}``."""
        return {"sent": self.sent, "received": self.received}


class ByteLedger:
    """Thread-safe counters of stream bytes per kind and per round.

    Totals per kind are kept forever; per-round cells are kept for the last ``keep_rounds`` distinct
    (kind, round) pairs so a long run does not grow without bound.

    Example:
        >>> ledger = ByteLedger()
        >>> ledger.add_sent("reduce", 3, 100)
        >>> ledger.add_received("reduce", 3, 40)
        >>> ledger.round_bytes("reduce", 3)
        (100, 40)
        >>> ledger.totals()["sent"]
        100
    """

    def __init__(self, keep_rounds: int = 4096) -> None:
        if keep_rounds < 1:
            raise ConfigError("ByteLedger keep_rounds must be >= 1")
        self._lock = threading.Lock()
        self._keep = keep_rounds
        self._kinds: dict[str, LedgerEntry] = {}
        self._rounds: OrderedDict[tuple[str, int], LedgerEntry] = OrderedDict()

    def _cell(self, kind: str, round_id: int) -> tuple[LedgerEntry, LedgerEntry]:
        total = self._kinds.get(kind)
        if total is None:
            total = self._kinds[kind] = LedgerEntry()
        key = (kind, int(round_id))
        cell = self._rounds.get(key)
        if cell is None:
            cell = self._rounds[key] = LedgerEntry()
            while len(self._rounds) > self._keep:
                self._rounds.popitem(last=False)
        return total, cell

    def add_sent(self, kind: str, round_id: int, nbytes: int) -> None:
        """Record ``nbytes`` written to a stream for ``kind`` in round ``round_id``."""
        if nbytes < 0:
            raise ConfigError("byte counts are non-negative")
        with self._lock:
            total, cell = self._cell(kind, round_id)
            total.sent += nbytes
            cell.sent += nbytes

    def add_received(self, kind: str, round_id: int, nbytes: int) -> None:
        """Record ``nbytes`` read from a stream for ``kind`` in round ``round_id``."""
        if nbytes < 0:
            raise ConfigError("byte counts are non-negative")
        with self._lock:
            total, cell = self._cell(kind, round_id)
            total.received += nbytes
            cell.received += nbytes

    def round_bytes(self, kind: str, round_id: int) -> tuple[int, int]:
        """``(sent, received)`` of one round of one kind; ``(0, 0)`` if unknown or evicted."""
        with self._lock:
            cell = self._rounds.get((kind, int(round_id)))
            return (cell.sent, cell.received) if cell is not None else (0, 0)

    def totals(self) -> dict[str, object]:
        """Totals: ``{"sent": int, "received": int, "by_kind": {kind: {"sent", "received"}}}``."""
        with self._lock:
            by_kind = {k: v.as_dict() for k, v in sorted(self._kinds.items())}
        return {
            "sent": sum(v["sent"] for v in by_kind.values()),
            "received": sum(v["received"] for v in by_kind.values()),
            "by_kind": by_kind,
        }

    @property
    def sent(self) -> int:
        """All bytes sent so far, every kind."""
        with self._lock:
            return sum(v.sent for v in self._kinds.values())

    @property
    def received(self) -> int:
        """All bytes received so far, every kind."""
        with self._lock:
            return sum(v.received for v in self._kinds.values())

    def snapshot(self) -> dict[str, object]:
        """A JSON-ready deep copy: the totals plus the per-round cells still kept.

        ``rounds`` is a list of ``{"kind", "round", "sent", "received"}`` in insertion order.
        """
        out = self.totals()
        with self._lock:
            out["rounds"] = [
                {"kind": k, "round": r, **cell.as_dict()} for (k, r), cell in self._rounds.items()
            ]
        return out

    def reset(self) -> None:
        """Forget everything counted so far (for a caller that measures phases separately)."""
        with self._lock:
            self._kinds.clear()
            self._rounds.clear()
