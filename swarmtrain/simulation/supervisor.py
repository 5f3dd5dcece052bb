"""The parent's side of a local run: it starts the peers, reads their reports, absorbs their deaths,
and runs the chaos (kills, preemptions) and its restarts (``swarmtrain.simulation.runner`` drives it)."""

from __future__ import annotations

import logging
import queue as queue_mod
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from peers.dht.process import process_context
from swarmtrain.core.config import Config
from swarmtrain.core.errors import PeerTimeoutError, SwarmError
from swarmtrain.core.peer_error import TRACEBACK, ErrorReports
from swarmtrain.simulation.children import peer_main
from swarmtrain.simulation.results import PeerOutcome, SimulationResult

if TYPE_CHECKING:
    from swarmtrain.app.peer.loop import PeerStatus
    from swarmtrain.simulation.chaos import ChaosSpec
    from swarmtrain.simulation.memory import RunMemory
    from swarmtrain.simulation.regions import EmulatedRegions

__all__ = ["Slot", "Supervisor", "Intrusion", "SLACK_S", "NEWCOMER_AT", "NEWCOMER_RESTART_S"]

logger = logging.getLogger(__name__)


@dataclass
class Slot:
    """One rank of the run: its current process (the latest incarnation) and what it reported."""

    rank: int
    proc: Any = None
    queue: Any = None  # this incarnation's own queue; None once the parent stopped reading it
    step: int = 0
    started: bool = False  # this incarnation reported a step
    outcome: PeerOutcome | None = None
    signalled: str = ""  # "kill" or "preempt" when the parent sent this incarnation its signal
    signalled_at: float = 0.0
    restart_at: float | None = None
    gone: bool = False  # dead and not coming back
    rejoining: bool = False  # restarted, no step reported yet
    failed: int = 0  # rounds this incarnation reported failed or late (its last status)
    failed_before: int = 0  # the same, summed over its earlier incarnations (killed, preempted)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.outcome is None and not self.signalled and self.proc.alive

    def new_incarnation(self, rejoin: bool) -> None:
        """A process (re)started for this rank: nothing reported yet; the failed rounds of the one
        before are kept, since its outcome never comes."""
        self.started, self.signalled, self.restart_at = False, "", None
        self.rejoining = rejoin
        self.failed_before, self.failed = self.failed_before + self.failed, 0


#: seconds past its ``peers.preempt_grace`` a preempted peer has before its group is killed
SLACK_S = 5.0
#: the newcomer event (``newcomer=True``): the last rank is preempted once every peer passed this
#: fraction of the steps, and restarted :data:`NEWCOMER_RESTART_S` seconds after it left
NEWCOMER_AT = 0.3
NEWCOMER_RESTART_S = 1.0


class Supervisor:
    """Starts the peers, reads their reports, absorbs their deaths, runs the chaos and its restarts."""

    def __init__(
        self,
        cfg: Config,
        cfg_jsons: list[str],
        shared_q: Any,
        procs: list[Any],
        level: int,
        chaos: ChaosSpec | None,
        *,
        newcomer: bool = False,
        control: bool = False,
    ) -> None:
        from swarmtrain.simulation.chaos import ChaosSchedule

        self.cfg, self.cfg_jsons, self.shared_q = cfg, cfg_jsons, shared_q
        self.procs, self.level = procs, level
        self.n = len(cfg_jsons)
        self.slots = [Slot(r) for r in range(self.n)]
        self.chaos = chaos
        self.schedule = ChaosSchedule(chaos, cfg.train.seed) if chaos is not None else None
        self.min_running = min(self.n, max(cfg.peers.min_peers, 2))
        self.on_progress: Callable[[int, PeerStatus], None] | None = None
        self.regions: EmulatedRegions | None = None
        self.intrusion = Intrusion({}, [], {})
        #: preempt the last rank mid-run and restart it (a download during the run), once
        self.newcomer = newcomer
        #: the peers run the old state rules (no commit certificates): an intruder run's control
        self.control = control
        self.memory: RunMemory | None = None  # the run's memory figures (set by the runner)
        self.timeline: list[dict[str, Any]] = []
        self.counts = {"kill": 0, "preempt": 0, "restart": 0, "died": 0}
        #: rounds any incarnation of any peer reported committed (a killed one's too)
        self.committed_seen: set[int] = set()
        #: each process's traceback text until its error line comes (``swarmtrain.core.peer_error``)
        self.errors = ErrorReports()
        self.t0 = time.monotonic()

    # -- processes
    def spawn(self, rank: int, rejoin: bool = False) -> None:
        from peers import spawn_function

        slot = self.slots[rank]
        # a restart is a cold start (a fresh interpreter importing everything), as a restarted
        # volunteer's new process is; first starts fork from the fork server
        slot.queue = process_context(cold=rejoin).Queue()
        self.errors.forget(rank)
        args = (rank, self.n, self.cfg_jsons[rank], slot.queue, self.level, rejoin, self.control)
        target = peer_main if self.regions is None else self.regions.entry(rank, peer_main)
        slot.proc = spawn_function(target, args, name=f"peer{rank}", cold=rejoin)
        self.procs.append(slot.proc)
        slot.new_incarnation(rejoin)

    def _event(self, slot: Slot, what: str, **extra: Any) -> None:
        from swarmtrain.simulation.chaos import timeline_event

        ev = timeline_event(time.monotonic() - self.t0, slot.rank, what, step=slot.step, **extra)
        self.timeline.append(ev)
        logger.warning("peer %d: %s at step %d (t=%.0f s)", slot.rank, what, slot.step, ev["t"])

    def _drop_queue(self, slot: Slot) -> None:
        if slot.queue is not None:
            slot.queue.cancel_join_thread()
            slot.queue.close()
            slot.queue = None

    # -- reading
    def _read(self, timeout: float) -> list[tuple[str, int, Any]]:
        from multiprocessing.connection import wait

        queues = [self.shared_q, *(s.queue for s in self.slots if s.queue is not None)]
        by_reader = {q._reader: q for q in queues}
        out: list[tuple[str, int, Any]] = []
        for reader in wait(list(by_reader), timeout=timeout):
            q = by_reader[reader]  # type: ignore[index]
            for _ in range(100):
                try:
                    out.append(q.get_nowait())
                except (queue_mod.Empty, EOFError, OSError):
                    break
        return out

    def _handle(self, msg: tuple[str, int, Any]) -> None:
        from swarmtrain.app.peer.loop import PeerStatus

        kind, rank, payload = msg
        slot = self.slots[rank] if 0 <= rank < self.n and kind in ("step", "done", "error") else None
        if kind == TRACEBACK:
            self.errors.note(rank, payload)
            return
        if kind == "error":
            if slot is not None and slot.signalled:
                logger.debug("peer %d after its %s: %s", rank, slot.signalled, payload)
                self.errors.forget(rank)
                return
            raise self.errors.error(rank, payload)
        if kind == "step" and slot is not None:
            slot.step = int(payload.get("step", slot.step))
            slot.failed = int(payload.get("failed", slot.failed))
            if payload.get("committed_round") is not None:
                self.committed_seen.add(int(payload["committed_round"]))
            if slot.rejoining:  # its first step after a restart: the state it adopted
                slot.rejoining = False
                self._event(slot, "rejoined")
            slot.started = True
            if self.on_progress is not None:
                self.on_progress(rank, PeerStatus(**payload))
        elif kind == "done" and slot is not None:
            slot.outcome = PeerOutcome(**payload)
            if slot.rejoining:  # it adopted the final state: no step left to train
                slot.rejoining = False
                slot.step = slot.outcome.steps
                self._event(slot, "rejoined")
        elif kind == "intruder":
            self.intrusion.reports[rank] = payload
        elif kind == "colluder":
            self.intrusion.colluders[rank] = payload
        elif kind in ("intruder_error", "colluder_error"):
            logger.warning("%s", payload)
            self.intrusion.errors.append(str(payload))

    # -- the loop
    def collect(self, deadline: float) -> list[PeerOutcome]:
        """Read reports until every rank has an outcome or is gone; returns the outcomes by rank.

        Raises:
            SwarmError: a peer reported an error (``PeerError``), every peer died, or the deadline
                passed.
        """
        while not all(s.outcome is not None or s.gone for s in self.slots):
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerTimeoutError("the simulation did not finish in time")
            for msg in self._read(min(left, 0.5)):
                self._handle(msg)
            now = time.monotonic()
            self._reap(now)
            self._restart(now)
            self._chaos(now)
            self._newcomer(now)
        outcomes = [s.outcome for s in self.slots if s.outcome is not None]
        if not outcomes:
            raise SwarmError(f"every peer died ({self._deaths_line()})")
        return outcomes

    def _deaths_line(self) -> str:
        c = self.counts
        return f"{c['kill']} killed, {c['preempt']} preempted, {c['died']} died, {c['restart']} restarted"

    def _ending(self) -> bool:
        """The run is near its end: no new fault, no restart (a late restart would find no donor)."""
        from swarmtrain.simulation.chaos import NO_RESTART_FROM

        steps = max(self.cfg.train.steps, 1)
        done = any(s.outcome is not None for s in self.slots)
        return done or max(s.step for s in self.slots) >= NO_RESTART_FROM * steps

    def _reap(self, now: float) -> None:
        """Notice dead peers (and preempted ones too slow to leave); schedule their restarts."""
        for s in self.slots:
            if s.proc is None or s.outcome is not None or s.gone or s.restart_at is not None:
                continue
            if s.proc.alive:
                if s.signalled == "preempt" and now - s.signalled_at > self.cfg.peers.preempt_grace + SLACK_S:
                    s.proc.terminate(grace=1.0)
                continue
            if not s.signalled:  # nobody here caused it: read what it managed to send, then log it
                for msg in self._read(0.0):
                    self._handle(msg)
                if s.outcome is not None:
                    continue
                self.counts["died"] += 1
                self._event(s, "died", exit_code=s.proc.exitcode)
            self._drop_queue(s)
            s.proc.terminate(grace=1.0)  # whatever is left of its group
            delay = self.chaos.restart_s if self.chaos is not None else None
            if self.newcomer and delay is None:
                delay = NEWCOMER_RESTART_S
            if delay is not None and not self._ending():
                s.restart_at = now + delay
            else:
                s.gone = True

    def _restart(self, now: float) -> None:
        for s in self.slots:
            if s.restart_at is None or now < s.restart_at:
                continue
            if self._ending():
                s.restart_at, s.gone = None, True
                self._event(s, "not_restarted", reason="the run is ending")
                continue
            self.spawn(s.rank, rejoin=True)
            self.counts["restart"] += 1
            s.step = max(x.step for x in self.slots)  # the swarm's step, which it will adopt
            self._event(s, "restart")

    def _chaos(self, now: float) -> None:
        import signal

        from swarmtrain.simulation.chaos import QUIET_FROM

        sched = self.schedule
        if sched is None:
            return
        if not sched.started:
            if all(s.started for s in self.slots):
                sched.start(now)
            return
        quiet = max(s.step for s in self.slots) >= QUIET_FROM * max(self.cfg.train.steps, 1)
        for kind in sched.due(now):
            if quiet or self._ending():
                continue
            running = [s.rank for s in self.slots if s.running and s.started]
            if len(running) <= self.min_running:
                logger.info("chaos: no %s now (%d peers running)", kind, len(running))
                continue
            slot = self.slots[sched.pick(running)]
            slot.signalled, slot.signalled_at = kind, now
            self.counts[kind] += 1
            self._event(slot, kind, pid=slot.proc.pid)
            self._drop_queue(slot)  # a SIGKILL mid-write would leave a torn message in it
            slot.proc.signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)

    def _newcomer(self, now: float) -> None:
        """The newcomer event: once every peer passed :data:`NEWCOMER_AT` of the steps, preempt the
        last rank (SIGTERM: it leaves through the graceful path); ``_reap`` restarts it, and the
        restarted peer downloads the run's state (or resumes its own saved one) while the others train."""
        import signal

        if not self.newcomer or self.counts["preempt"] or not all(s.started for s in self.slots):
            return
        if min(s.step for s in self.slots) < NEWCOMER_AT * max(self.cfg.train.steps, 1) or self._ending():
            return
        slot = self.slots[-1]
        if not slot.running:
            return
        slot.signalled, slot.signalled_at = "preempt", now
        self.counts["preempt"] += 1
        self._event(slot, "preempt", pid=slot.proc.pid, why="newcomer")
        self._drop_queue(slot)
        slot.proc.signal(signal.SIGTERM)

    def fill(self, res: SimulationResult) -> None:
        """Copy the faults into the result."""
        res.kills, res.preemptions = self.counts["kill"], self.counts["preempt"]
        res.restarts, res.deaths = self.counts["restart"], self.counts["died"]
        res.missing_ranks = [s.rank for s in self.slots if s.outcome is None]
        res.timeline = list(self.timeline)
        res.committed_seen = sorted(self.committed_seen)
        res.failed_before_restarts = sum(s.failed_before for s in self.slots)


@dataclass
class Intrusion:
    """What the intruders and colluders reported while the peers ran: the last report of each, and
    failures."""

    reports: dict[int, dict[str, Any]]
    errors: list[str]
    colluders: dict[int, dict[str, Any]]
