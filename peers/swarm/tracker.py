"""Micro-batch bookkeeping of a SWARM trainer: exclusions, reroutes, nothing lost or counted twice.

:class:`Exclusions` remembers servers that failed a request for a while (they are not picked again
until the exclusion expires; a server that died disappears from the DHT before that).
:class:`MicrobatchTracker` follows every micro-batch from its start to its one completion: a
completed micro-batch cannot complete again, one that was started and never completed is lost, and
each retry on another server is a reroute.

Pure: the caller passes the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarmtrain.core.errors import ConfigError

__all__ = ["Exclusions", "MicrobatchTracker", "TrackerStats"]


class Exclusions:
    """Servers left out of routing until a time.

    Args:
        ttl: seconds a failed server stays excluded.
    """

    def __init__(self, ttl: float = 30.0) -> None:
        if not ttl > 0:
            raise ConfigError("exclusion ttl must be > 0")
        self.ttl = float(ttl)
        self._until: dict[str, float] = {}

    def exclude(self, peer_id: str, now: float, ttl: float | None = None) -> None:
        """Leave ``peer_id`` out until ``now + ttl`` (default: the constructor's ``ttl``); an
        exclusion already running longer is kept."""
        until = now + (self.ttl if ttl is None else float(ttl))
        self._until[peer_id] = max(until, self._until.get(peer_id, until))

    def active(self, now: float) -> frozenset[str]:
        """The servers excluded at ``now`` (expired entries are dropped)."""
        for p in [p for p, t in self._until.items() if t <= now]:
            del self._until[p]
        return frozenset(self._until)


@dataclass
class TrackerStats:
    """Counts of one trainer's micro-batches."""

    started: int = 0
    completed: int = 0
    rerouted: int = 0
    failed_requests: int = 0
    samples: int = 0
    #: reroutes by why the request failed (``timeout``, ``refused``, ``busy``, ``error``)
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        """Micro-batches started and never completed."""
        return self.started - self.completed


@dataclass
class MicrobatchTracker:
    """Start, reroute and complete micro-batches by their run-wide ID."""

    stats: TrackerStats = field(default_factory=TrackerStats)
    _open: set[int] = field(default_factory=set)
    _done: set[int] = field(default_factory=set)

    def start(self, mb_id: int) -> None:
        """A micro-batch enters the pipeline.

        Raises:
            ConfigError: it was started before (a micro-batch is fed once).
        """
        if mb_id in self._open or mb_id in self._done:
            raise ConfigError(f"micro-batch {mb_id} was already fed")
        self._open.add(mb_id)
        self.stats.started += 1

    def reroute(self, mb_id: int, reason: str = "error") -> None:
        """A request of ``mb_id`` failed (for ``reason``) and goes to another server of the stage."""
        if mb_id not in self._open:
            raise ConfigError(f"micro-batch {mb_id} is not in flight")
        self.stats.failed_requests += 1
        self.stats.rerouted += 1
        self.stats.reasons[reason] = self.stats.reasons.get(reason, 0) + 1

    def reopen(self, mb_id: int) -> None:
        """A completed micro-batch is fed again (a dead server took its gradients): in flight once
        more, still counted once.

        Raises:
            ConfigError: it did not complete.
        """
        if mb_id not in self._done:
            raise ConfigError(f"micro-batch {mb_id} did not complete")
        self._done.discard(mb_id)
        self._open.add(mb_id)

    def complete(self, mb_id: int, samples: int, *, again: bool = False) -> None:
        """``mb_id`` went forward and backward through every stage (``again``: after
        :meth:`reopen`; not counted a second time).

        Raises:
            ConfigError: it is not in flight (never started, or completed already).
        """
        if mb_id not in self._open:
            raise ConfigError(f"micro-batch {mb_id} is not in flight (completed twice?)")
        self._open.discard(mb_id)
        self._done.add(mb_id)
        if not again:
            self.stats.completed += 1
            self.stats.samples += samples

    def in_flight(self) -> frozenset[int]:
        """Micro-batches started and not completed."""
        return frozenset(self._open)
