"""``simulate --strategy swarm --chaos SPEC``: kill, preempt and restart stage servers while trainers train.

The spec and its schedule are those of the data-parallel strategies (``swarmtrain.simulation.chaos``):
a SIGKILL (crash) or SIGTERM (preemption: the server leaves through its graceful path) of a random
server at the rates asked for, and a restart with the same identity, rank and stage after the delay;
the restarted server starts late, so it downloads its stage's state from a replica before it serves
(``swarmtrain.app.swarm.server``). Progress here is the trainers' micro-batches: faults start once
every trainer has completed one and stop at :data:`~swarmtrain.simulation.chaos.QUIET_FROM` of them,
restarts at :data:`~swarmtrain.simulation.chaos.NO_RESTART_FROM`.

A fault never takes the last server of a stage that serves in step with it: the victim's stage must
keep another server that is caught up, or the stage's state would be lost with it (a stage has no
other copy; a catching-up server downloads it from those). The runner (``swarmtrain.simulation.swarm``)
owns the processes; this module decides what happens to them and keeps the count and the timeline.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from swarmtrain.simulation.chaos import (
    NO_RESTART_FROM,
    QUIET_FROM,
    ChaosSchedule,
    ChaosSpec,
    timeline_event,
)

__all__ = ["ServerChaos", "ChaosServer", "victims"]

logger = logging.getLogger(__name__)

#: seconds beyond ``peers.preempt_grace`` a preempted server may take to exit before it is killed
SLACK_S = 10.0


class ChaosServer(Protocol):
    """What the chaos reads and sets on one server process of the runner (``swarm._Child``)."""

    rank: int
    stage: int
    serving: bool
    killed: bool  # gone from the run: its queue is no longer read
    proc: Any  # peers.dht.process.PeerProcess


def victims(servers: Sequence[ChaosServer]) -> list[ChaosServer]:
    """The servers a fault may take: running ones whose stage keeps another running server that serves
    in step with its replicas (not one still catching up)."""
    running = [c for c in servers if not c.killed]
    return [c for c in running if any(o is not c and o.stage == c.stage and o.serving for o in running)]


@dataclass
class ServerChaos:
    """The chaos of one SWARM run. ``spawn(rank, stage)`` starts a server again (the runner appends it
    to its servers and returns it); ``t0`` is the run's start on the ``now`` clock (``time.monotonic``)."""

    spec: ChaosSpec
    seed: int
    spawn: Callable[[int, int], ChaosServer]
    t0: float
    preempt_grace: float
    counts: dict[str, int] = field(default_factory=lambda: {"kill": 0, "preempt": 0, "restart": 0})
    timeline: list[dict[str, Any]] = field(default_factory=list)
    #: ``(due, server)``: the servers that went, to start again (once their process is gone too)
    pending: list[tuple[float, ChaosServer]] = field(default_factory=list)
    #: preempted servers still leaving, with when they were asked to
    leaving: list[tuple[ChaosServer, float]] = field(default_factory=list)
    schedule: ChaosSchedule = field(init=False)

    def __post_init__(self) -> None:
        self.schedule = ChaosSchedule(self.spec, self.seed)

    def _event(self, now: float, rank: int, what: str, **extra: Any) -> None:
        self.timeline.append(timeline_event(now - self.t0, rank, what, **extra))
        logger.info("chaos: %s server%d %s", what, rank, extra or "")

    def tick(self, now: float, servers: Sequence[ChaosServer], started: bool, progress: float) -> None:
        """Start the schedule once every trainer ``started``; then restart, kill and preempt what is
        due at ``now``, ``progress`` being the trainers' fraction of micro-batches done."""
        if not self.schedule.started:
            if started:
                self.schedule.start(now)
            return
        self._reap(now)
        ending = progress >= NO_RESTART_FROM
        for due, old in [p for p in self.pending if p[0] <= now]:
            if ending:
                self.pending.remove((due, old))
                self._event(now, old.rank, "not_restarted", reason="the run is ending")
            elif not old.proc.alive:  # a preempted server may still be leaving: one process per identity
                self.pending.remove((due, old))
                old.proc.terminate(grace=1.0)  # whatever is left of its group (DHT helper, p2pd)
                self.spawn(old.rank, old.stage)
                self.counts["restart"] += 1
                self._event(now, old.rank, "restart", stage=old.stage)
        for kind in self.schedule.due(now):
            if progress >= QUIET_FROM:
                continue
            pool = victims(servers)
            if not pool:
                logger.info("chaos: no %s now (no stage keeps another server serving)", kind)
                continue
            by_rank = {c.rank: c for c in pool}
            victim = by_rank[self.schedule.pick(list(by_rank))]
            self._hit(now, victim, kind)

    def finish(self, now: float) -> None:
        """The trainers are done: a restart still pending will not happen; the timeline says so."""
        for _, old in self.pending:
            self._event(now, old.rank, "not_restarted", reason="the run ended first")
        self.pending.clear()

    def _hit(self, now: float, victim: ChaosServer, kind: str) -> None:
        victim.killed = True  # its queue is not read again: a SIGKILL mid-write would leave a torn message
        self.counts[kind] += 1
        self._event(now, victim.rank, kind, stage=victim.stage, pid=victim.proc.pid)
        victim.proc.signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
        if kind == "preempt":
            self.leaving.append((victim, now))
        if self.spec.restart_s is not None:
            self.pending.append((now + self.spec.restart_s, victim))

    def _reap(self, now: float) -> None:
        """A preempted server that overstays its grace is killed (a hung leave must not hang the run)."""
        for c, at in list(self.leaving):
            if not c.proc.alive:
                self.leaving.remove((c, at))
            elif now - at > self.preempt_grace + SLACK_S:
                logger.warning("chaos: server%d did not leave within its grace; killing it", c.rank)
                c.proc.terminate(grace=1.0)
                self.leaving.remove((c, at))
