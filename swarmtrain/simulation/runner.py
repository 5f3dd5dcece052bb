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
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from peers.dht.process import process_context
from swarmtrain.core.config import Config
from swarmtrain.core.errors import SwarmError
from swarmtrain.core.peer_error import TRACEBACK, ErrorReports
from swarmtrain.simulation.children import bootstrap_main, next_report, peer_main
from swarmtrain.simulation.credentials import admitted_configs
from swarmtrain.simulation.memory import RunMemory
from swarmtrain.simulation.results import PeerOutcome, SimulationResult, params_identical
from swarmtrain.simulation.supervisor import Supervisor

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
    "child_log_level",
    "start_bootstrap",
    "tear_down",
]

logger = logging.getLogger(__name__)

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def run_simulation(
    cfg: Config,
    n_peers: int,
    *,
    timeout: float = 1800.0,
    on_progress: Callable[[int, PeerStatus], None] | None = None,
    intruders: int = 0,
    chaos: ChaosSpec | None = None,
    regions: EmulatedRegions | None = None,
    colluders: int = 0,
    newcomer: bool = False,
    old_state_rules: bool = False,
) -> SimulationResult:
    """Train ``cfg`` with ``n_peers`` real peer processes on loopback and collect their outcomes.

    Args:
        cfg: the run configuration (strategy, codec, steps...). Peers listen on 127.0.0.1 only.
        n_peers: number of training peers (a bootstrap DHT node is started besides them).
        intruders: non-admitted processes that attack the run until it ends
            (``swarmtrain.simulation.outsider``); their reports land in the result.
        chaos: kill, preempt and restart peers while they train (``swarmtrain.simulation.chaos``).
        regions: run each process in its emulated region instead (``swarmtrain.simulation.regions``).
        colluders: admitted processes that plant a forged state (``swarmtrain.simulation.colluder``).
        newcomer: preempt the last rank mid-run and restart it, so a state is downloaded during the
            run (``Supervisor``'s newcomer event).
        old_state_rules: the peers take states by the rules before commit certificates (a control).
        timeout: seconds for the whole run; every process is torn down after it.
        on_progress: called with (rank, the peer's live status) as peers report (several times a
            second each).

    A peer that dies (killed by the chaos or anything else) is absorbed: the others go on, and the
    result lists the ranks that ended without an outcome (``missing_ranks``) and the ``timeline``.

    Raises:
        SwarmError: a peer reported an error (``PeerError``: its one line says why, and it carries
            the peer's own traceback), every peer died, or the run timed out.
    """
    from swarmtrain.simulation.wiring import check_attack_fits_strategy

    if n_peers < 1:
        raise SwarmError("need at least one peer")
    check_attack_fits_strategy(cfg)
    cfg = loopback_copy(cfg)
    t0 = time.perf_counter()
    outcomes, sup = _run_processes(
        cfg, n_peers, timeout, on_progress, intruders, chaos, regions, colluders, newcomer, old_state_rules
    )
    res = _summarise(cfg, outcomes, time.perf_counter() - t0, sup, intruders)
    res.colluders, res.old_state_rules = colluders, old_state_rules
    res.colluder_reports = [sup.intrusion.colluders[i] for i in sorted(sup.intrusion.colluders)]
    return res


def _run_processes(
    cfg: Config,
    n_peers: int,
    timeout: float,
    on_progress: Callable[[int, PeerStatus], None] | None,
    intruders: int,
    chaos: ChaosSpec | None,
    regions: EmulatedRegions | None,
    colluders: int,
    newcomer: bool,
    old_state_rules: bool,
) -> tuple[Any, Supervisor]:
    """Start the bootstrap, the peers, intruders and colluders; collect the peers' outcomes; tear
    every process down. Returns (outcomes, the supervisor)."""
    quiet_resource_tracker()
    q = process_context().Queue()
    procs: list[Any] = []
    deadline = time.monotonic() + timeout
    level = child_log_level()
    sup: Supervisor | None = None

    def ranks() -> dict[int, int]:  # each rank's current process, for the memory figures
        slots = sup.slots if sup is not None else []
        return {s.rank: s.proc.pid for s in slots if s.proc is not None and not s.gone}

    memory = RunMemory(ranks)
    with tempfile.TemporaryDirectory(prefix="swarmtrain-sim-") as folder:
        boot_cfg, rank_cfgs = admitted_configs(cfg, n_peers, Path(folder), colluders)
        rank_cfgs, colluder_cfgs = rank_cfgs[:n_peers], rank_cfgs[n_peers:]
        if regions is not None:
            regions.place(boot_cfg, rank_cfgs)
        try:
            initial = start_bootstrap(boot_cfg, q, level, regions, procs, deadline)
            for rc in rank_cfgs + colluder_cfgs:
                rc.peers.initial_peers = initial
            jsons = [rc.model_dump_json() for rc in rank_cfgs]
            sup = Supervisor(cfg, jsons, q, procs, level, chaos, newcomer=newcomer, control=old_state_rules)
            sup.on_progress, sup.regions = on_progress, regions
            for rank in range(n_peers):
                sup.spawn(rank)
            memory.start()
            _start_intruders(intruders, cfg, initial, q, level, procs)
            _start_colluders(colluder_cfgs, q, level, procs)
            outcomes = sup.collect(deadline)
        finally:
            memory.stop()
            tear_down(procs, q)
    if sup is None:  # unreachable: it is made before any peer runs, or the run raised
        raise SwarmError("the simulation started no peer")
    sup.memory = memory
    return outcomes, sup


def child_log_level() -> int:
    """The log level of the child processes: this process's when it shows warnings' details, else
    errors only."""
    level = logging.getLogger().getEffectiveLevel()
    return level if level < logging.WARNING else logging.ERROR


def start_bootstrap(
    boot_cfg: Config, q: Any, level: int, regions: EmulatedRegions | None, procs: list[Any], deadline: float
) -> list[str]:
    """Start the bootstrap DHT node (in its region, if any) and return its multiaddrs."""
    from peers import spawn_function

    boot_main = bootstrap_main if regions is None else regions.entry(-1, bootstrap_main)
    procs.append(spawn_function(boot_main, (boot_cfg.model_dump_json(), q, level), name="bootstrap"))
    return bootstrap_maddrs(q, deadline)


def _start_intruders(n: int, cfg: Config, initial: list[str], q: Any, level: int, procs: list[Any]) -> None:
    """Start ``n`` non-admitted processes that attack the run (``swarmtrain.simulation.outsider``)."""
    if not n:
        return
    from peers import spawn_function
    from swarmtrain.simulation.outsider import intruder_main

    for i in range(n):
        procs.append(
            spawn_function(intruder_main, (i, cfg.model_dump_json(), initial, q, level), name=f"intruder{i}")
        )


def _start_colluders(cfgs: list[Config], q: Any, level: int, procs: list[Any]) -> None:
    """Start one admitted colluder per config (``swarmtrain.simulation.colluder``)."""
    if not cfgs:
        return
    from peers import spawn_function
    from swarmtrain.simulation.colluder import colluder_main

    for i, c in enumerate(cfgs):
        args = (i, len(cfgs), c.model_dump_json(), q, level)
        procs.append(spawn_function(colluder_main, args, name=f"colluder{i}"))


def tear_down(procs: list[Any], q: Any = None) -> None:
    """Stop every process of the run, say which left processes behind, and close the queue ``q``."""
    from peers import find_orphans

    stop_peers(procs)
    left = [o for p in procs for o in find_orphans(p.marker)]
    if left:
        logger.error("processes left behind after the simulation: %s", [o.pid for o in left])
    if q is not None:
        q.close()


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
        kind, rank, payload = next_report(q, deadline)
        if kind == TRACEBACK:
            errors.note(rank, payload)
        if kind == "error":
            raise errors.error(rank, payload)
        if kind == "bootstrap" and payload:
            return list(payload)


def _summarise(
    cfg: Config, ordered: list[PeerOutcome], wall: float, sup: Supervisor, intruders: int
) -> SimulationResult:
    """The run's result: the peers' outcomes summed and compared, the intruders' reports, and what
    the supervisor saw (deaths, chaos, timeline)."""
    n_peers = len(ordered)
    res = SimulationResult(
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
    res.intruders = intruders
    res.intruder_reports = [sup.intrusion.reports[i] for i in sorted(sup.intrusion.reports)]
    res.intruder_errors = sup.intrusion.errors
    sup.fill(res)
    if sup.memory is not None:
        res.peak_rss_total_mib, res.rss_per_peer_mib = sup.memory.total_mib, sup.memory.per_peer_mib
    return res


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
