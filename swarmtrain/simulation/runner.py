"""A local multi-peer run: a bootstrap DHT node and N real peer processes on 127.0.0.1.

Each peer is a separate interpreter in its own process group (``peers.dht.process.spawn_function``), with
its own hivemind DHT node and p2pd daemon; the peers find each other through the bootstrap node and
train one model with the configured strategy over ``peers.P2PCollective``. Each peer runs the app's
peer loop (``swarmtrain.app.peer.loop``, the one ``swarmtrain join`` runs) with a fixed rank and the
hooks that install its rank's attacks (``swarmtrain.simulation.wiring``). The parent collects each
peer's outcome through a queue of its own (final validation loss, a digest of its parameters after
every committed sync, its byte ledger) and always tears every process group down. Every process
started here dies with the parent (``peers.dht.process.die_with_parent``).

A peer that dies is a fault the run absorbs, not an error: the others go on, and the result says who
died when (``timeline``) and how the survivors fared. With ``chaos`` (``swarmtrain.simulation.chaos``)
the parent itself kills (SIGKILL) and preempts (SIGTERM) random peers and restarts them after a delay
with the same identity and rank; a restarted peer rejoins as a late peer and adopts the swarm's state.
Each peer process writes to its own queue: a peer SIGKILLed while writing would otherwise leave a
shared queue's write lock held, and every other peer's reports stuck behind it.

``run_simulation`` is what ``swarmtrain simulate`` and the integration tests drive.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue as queue_mod
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmtrain.core.config import Config
from swarmtrain.core.errors import PeerTimeoutError, SwarmError
from swarmtrain.core.peer_error import TRACEBACK, ErrorReports, report_error
from swarmtrain.simulation.credentials import admitted_configs
from swarmtrain.simulation.logs import quiet_logs
from swarmtrain.simulation.results import PeerOutcome, SimulationResult, params_identical

if TYPE_CHECKING:
    from swarmtrain.app.peer.loop import PeerStatus
    from swarmtrain.simulation.chaos import ChaosSpec
    from swarmtrain.simulation.regions import EmulatedRegions

__all__ = [
    "PeerOutcome",
    "SimulationResult",
    "run_simulation",
    "params_identical",
    "stop_peers",
    # the pieces swarmtrain.simulation.swarm and the WAN benchmark start their own runs from
    "bootstrap_main",
    "bootstrap_maddrs",
    "peer_main",
    "loopback_copy",
    "quiet_resource_tracker",
]

logger = logging.getLogger(__name__)

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


# ------------------------------------------------------------------------------ child processes


def bootstrap_main(cfg_json: str, q: Any, log_level: int = logging.ERROR) -> None:
    """A DHT bootstrap node: reports its multiaddrs, then serves until its group is terminated."""
    from peers import GracefulExit, PeerNode

    quiet_logs(log_level)

    cfg = Config.model_validate_json(cfg_json)
    try:
        with GracefulExit() as stop, PeerNode(cfg.peers, role="bootstrap") as node:
            q.put(("bootstrap", -1, node.visible_maddrs))
            stop.wait(None)
    except BaseException as e:  # report, never hang the parent
        report_error(q, -1, "bootstrap", e)


def peer_main(
    rank: int, n_peers: int, cfg_json: str, q: Any, log_level: int = logging.ERROR, rejoin: bool = False
) -> None:
    """One training peer: the app's peer loop with this rank's attack hooks; reports progress and a
    final ``PeerOutcome``. ``rejoin``: a restarted peer, which adopts the swarm's state before its
    first step and after a failed round, as a volunteer does."""
    from swarmtrain.app.peer.loop import Membership, PeerRun, run_peer
    from swarmtrain.simulation.rss import RssWatch
    from swarmtrain.simulation.wiring import RankWiring

    quiet_logs(log_level)

    try:
        cfg = Config.model_validate_json(cfg_json)
        wiring = RankWiring(cfg, rank, n_peers)
        rss = RssWatch()

        def status(s: PeerStatus) -> None:
            rss.start()  # from the first step: the model, data and optimizer are in memory
            q.put(("step", rank, asdict(s)))

        def finished(run: PeerRun) -> None:
            # reported before the peer lingers: it stays reachable until the parent has every
            # outcome, since a peer that leaves early would make a slower peer's last round fail
            if run.stopped_by_signal:
                q.put(("error", rank, f"peer {rank}: stopped by a signal before its last step"))
            else:
                outcome = replace(_outcome(rank, run, wiring.stats()), rss_growth_mib=rss.stop())
                q.put(("done", rank, asdict(outcome)))

        hooks = replace(wiring.hooks(), on_status=status, on_finished=finished)
        membership = Membership.fixed(rank, n_peers, cfg.peers)
        if rejoin:
            membership = replace(membership, catch_up_on_join=True, catch_up_after_failure=True)
        run_peer(cfg, membership, hooks)
    except BaseException as e:
        report_error(q, rank, f"peer {rank}", e)


def _outcome(rank: int, run: Any, attack_stats: dict[str, int]) -> PeerOutcome:
    """A ``PeerOutcome`` from the peer loop's ``PeerRun``. A late round counts as failed here too,
    and ``late_rounds`` only those after which the peer adopted the committed state, as the figures
    of earlier runs were counted."""
    return PeerOutcome(
        rank=rank,
        peer_id=run.peer_id,
        steps=run.steps,
        tokens=run.tokens,
        final_train_loss=run.final_train_loss,
        final_val_loss=run.final_val_loss,
        final_digest=run.final_digest,
        sync_digests=run.sync_digests,
        committed_rounds=run.committed_rounds,
        failed_rounds=run.failed_rounds + run.late_rounds,
        peak_sync_bytes_sent=run.peak_sync_bytes_sent,
        comm_wait_s=run.comm_wait_s,
        bytes_sent=run.bytes_sent,
        bytes_received=run.bytes_received,
        ledger=run.ledger,
        wall_s=run.wall_s,
        banned=run.banned,
        late_rounds=run.late_caught_up,
        attack_stats=attack_stats,
        donors=[str(d.get("donor", "")) for d in run.downloads],
        fragment_rounds={
            int(f): {"committed": c.get("committed", 0), "failed": c.get("failed", 0) + c.get("late", 0)}
            for f, c in getattr(run, "fragment_rounds", {}).items()
        },
        device=run.device,
    )


# ------------------------------------------------------------------------------------- parent
def _next(q: Any, deadline: float) -> tuple[str, int, Any]:
    left = deadline - time.monotonic()
    if left <= 0:
        raise PeerTimeoutError("the simulation did not finish in time")
    try:
        msg: tuple[str, int, Any] = q.get(timeout=min(left, 1.0))
        return msg
    except queue_mod.Empty:
        return ("tick", -1, None)


def run_simulation(
    cfg: Config,
    n_peers: int,
    *,
    timeout: float = 1800.0,
    on_progress: Callable[[int, PeerStatus], None] | None = None,
    intruders: int = 0,
    chaos: ChaosSpec | None = None,
    regions: EmulatedRegions | None = None,
) -> SimulationResult:
    """Train ``cfg`` with ``n_peers`` real peer processes on loopback and collect their outcomes.

    Args:
        cfg: the run configuration (strategy, codec, steps...). Peers listen on 127.0.0.1 only.
        n_peers: number of training peers (a bootstrap DHT node is started besides them).
        intruders: non-admitted processes that attack the run until it ends
            (``swarmtrain.simulation.outsider``); their reports land in the result.
        chaos: kill, preempt and restart peers while they train (``swarmtrain.simulation.chaos``).
        regions: run each process in its emulated region instead (``swarmtrain.simulation.regions``).
        timeout: seconds for the whole run; every process is torn down after it.
        on_progress: called with (rank, the peer's live status) as peers report (several times a
            second each).

    A peer that dies (killed by the chaos or anything else) is absorbed: the others go on, and the
    result lists the ranks that ended without an outcome (``missing_ranks``) and the ``timeline``.

    Raises:
        SwarmError: a peer reported an error (``PeerError``: its one line says why, and it carries
            the peer's own traceback), every peer died, or the run timed out.
    """
    from peers import find_orphans, spawn_function
    from swarmtrain.simulation.wiring import check_attack_fits_strategy

    if n_peers < 1:
        raise SwarmError("need at least one peer")
    check_attack_fits_strategy(cfg)
    cfg = loopback_copy(cfg)
    quiet_resource_tracker()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs: list[Any] = []
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="swarmtrain-sim-") as folder:
        boot_cfg, rank_cfgs = admitted_configs(cfg, n_peers, Path(folder))
        if regions is not None:
            regions.place(boot_cfg, rank_cfgs)
        boot_main = bootstrap_main if regions is None else regions.entry(-1, bootstrap_main)
        try:
            level = logging.getLogger().getEffectiveLevel()
            level = level if level < logging.WARNING else logging.ERROR
            boot = spawn_function(boot_main, (boot_cfg.model_dump_json(), q, level), name="bootstrap")
            procs.append(boot)
            initial = bootstrap_maddrs(q, deadline)
            for rc in rank_cfgs:
                rc.peers.initial_peers = initial
            sup = _Supervisor(cfg, [rc.model_dump_json() for rc in rank_cfgs], q, procs, level, chaos)
            sup.on_progress, sup.regions = on_progress, regions
            for rank in range(n_peers):
                sup.spawn(rank)
            if intruders:
                from swarmtrain.simulation.outsider import intruder_main

                for i in range(intruders):
                    iargs = (i, cfg.model_dump_json(), initial, q, level)
                    procs.append(spawn_function(intruder_main, iargs, name=f"intruder{i}"))
            outcomes = sup.collect(deadline)
        finally:
            stop_peers(procs)
            left = [o for p in procs for o in find_orphans(p.marker)]
            if left:
                logger.error("processes left behind after the simulation: %s", [o.pid for o in left])
            q.close()
    res = _summarise(cfg, outcomes, time.perf_counter() - t0)
    res.intruders = intruders
    res.intruder_reports = [sup.intrusion.reports[i] for i in sorted(sup.intrusion.reports)]
    res.intruder_errors = sup.intrusion.errors
    sup.fill(res)
    return res


@dataclass
class _Slot:
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


class _Supervisor:
    """Starts the peers, reads their reports, absorbs their deaths, runs the chaos and its restarts."""

    def __init__(
        self,
        cfg: Config,
        cfg_jsons: list[str],
        shared_q: Any,
        procs: list[Any],
        level: int,
        chaos: ChaosSpec | None,
    ) -> None:
        from swarmtrain.simulation.chaos import ChaosSchedule

        self.cfg, self.cfg_jsons, self.shared_q = cfg, cfg_jsons, shared_q
        self.procs, self.level = procs, level
        self.n = len(cfg_jsons)
        self.slots = [_Slot(r) for r in range(self.n)]
        self.chaos = chaos
        self.schedule = ChaosSchedule(chaos, cfg.train.seed) if chaos is not None else None
        self.min_running = min(self.n, max(cfg.peers.min_peers, 2))
        self.on_progress: Callable[[int, PeerStatus], None] | None = None
        self.regions: EmulatedRegions | None = None
        self.intrusion = _Intrusion({}, [])
        self.timeline: list[dict[str, Any]] = []
        self.counts = {"kill": 0, "preempt": 0, "restart": 0, "died": 0}
        #: rounds any incarnation of any peer reported committed (a killed one's too)
        self.committed_seen: set[int] = set()
        #: each process's traceback text until its error line comes (``swarmtrain.core.peer_error``)
        self.errors = ErrorReports()
        self.t0 = time.monotonic()
        self._ctx = mp.get_context("spawn")

    # -- processes
    def spawn(self, rank: int, rejoin: bool = False) -> None:
        from peers import spawn_function

        slot = self.slots[rank]
        slot.queue = self._ctx.Queue()
        self.errors.forget(rank)
        args = (rank, self.n, self.cfg_jsons[rank], slot.queue, self.level, rejoin)
        target = peer_main if self.regions is None else self.regions.entry(rank, peer_main)
        slot.proc = spawn_function(target, args, name=f"peer{rank}")
        self.procs.append(slot.proc)
        slot.new_incarnation(rejoin)

    def _event(self, slot: _Slot, what: str, **extra: Any) -> None:
        from swarmtrain.simulation.chaos import timeline_event

        ev = timeline_event(time.monotonic() - self.t0, slot.rank, what, step=slot.step, **extra)
        self.timeline.append(ev)
        logger.warning("peer %d: %s at step %d (t=%.0f s)", slot.rank, what, slot.step, ev["t"])

    def _drop_queue(self, slot: _Slot) -> None:
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
        elif kind == "intruder_error":
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
            if self.chaos is not None and self.chaos.restart_s is not None and not self._ending():
                s.restart_at = now + self.chaos.restart_s
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

    def fill(self, res: SimulationResult) -> None:
        """Copy the faults into the result."""
        res.kills, res.preemptions = self.counts["kill"], self.counts["preempt"]
        res.restarts, res.deaths = self.counts["restart"], self.counts["died"]
        res.missing_ranks = [s.rank for s in self.slots if s.outcome is None]
        res.timeline = list(self.timeline)
        res.committed_seen = sorted(self.committed_seen)
        res.failed_before_restarts = sum(s.failed_before for s in self.slots)


@dataclass
class _Intrusion:
    """What the intruders reported while the peers ran: the last report of each, and failures."""

    reports: dict[int, dict[str, Any]]
    errors: list[str]


def loopback_copy(cfg: Config) -> Config:
    """``cfg`` for peers that share this machine: loopback addresses, no progress bar, one thread each
    unless set."""
    cfg = cfg.model_copy(deep=True)
    cfg.peers.host_maddrs = list(LOOPBACK)
    cfg.peers.announce_maddrs = []
    cfg.train.progress = False
    if cfg.train.threads is None:
        cfg.train.threads = 1  # N peers share this machine's cores
    return cfg


def bootstrap_maddrs(q: Any, deadline: float) -> list[str]:
    """Wait for the bootstrap node's multiaddrs.

    Raises:
        PeerError: the bootstrap node reported an error (with its traceback).
    """
    errors = ErrorReports()
    while True:
        kind, rank, payload = _next(q, deadline)
        if kind == TRACEBACK:
            errors.note(rank, payload)
        if kind == "error":
            raise errors.error(rank, payload)
        if kind == "bootstrap" and payload:
            return list(payload)


def _summarise(cfg: Config, ordered: list[PeerOutcome], wall: float) -> SimulationResult:
    n_peers = len(ordered)
    return SimulationResult(
        strategy=cfg.strategy.name,
        compressor=cfg.compression.codec,
        peers=n_peers,
        steps=ordered[0].steps,
        tokens=sum(o.tokens for o in ordered),
        final_val_loss=float(sum(o.final_val_loss or float("nan") for o in ordered) / n_peers),
        params_identical=params_identical(ordered),
        admission=cfg.peers.admission,
        bytes_sent_per_peer=sum(o.bytes_sent for o in ordered) / n_peers,
        bytes_received_per_peer=sum(o.bytes_received for o in ordered) / n_peers,
        wall_s=wall,
        peak_sync_bytes_sent=max(o.peak_sync_bytes_sent for o in ordered),
        compute_utilization=1.0 - sum(o.comm_wait_s / max(o.wall_s, 1e-9) for o in ordered) / n_peers,
        outcomes=ordered,
    )


#: the warning filter the resource tracker process starts with (it takes this interpreter's -W flags)
_TRACKER_FILTER = "ignore::UserWarning:multiprocessing.resource_tracker"


def quiet_resource_tracker() -> None:
    """Keep multiprocessing's resource tracker from printing "leaked semaphore objects" after the
    run (unless -v). The semaphores are hivemind's, in peer processes killed at the end of a run
    before their finalizers ran; the tracker unlinks them either way, which is its job, so the line
    only alarms. The tracker is a process of its own, started with the first queue: it reads the
    filter from ``sys.warnoptions`` then, and a tracker already running keeps its own."""
    import sys

    if logging.getLogger().getEffectiveLevel() > logging.DEBUG and _TRACKER_FILTER not in sys.warnoptions:
        sys.warnoptions.append(_TRACKER_FILTER)


def stop_peers(procs: list[Any]) -> None:
    """Ask every peer to leave (SIGTERM to its main process: it deregisters and exits), then kill
    whatever is left of each process group."""
    import signal

    for p in procs:
        if p.alive:
            p.signal(signal.SIGTERM)
    end = time.monotonic() + 15.0
    for p in procs:
        p.join(max(0.1, end - time.monotonic()))
    for p in reversed(procs):
        p.terminate(grace=3.0)
