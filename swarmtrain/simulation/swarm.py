"""``simulate --strategy swarm``: SWARM parallelism with real peer processes on this machine.

A bootstrap DHT node, ``servers`` stage servers spread round-robin over the stages
(``swarmtrain.app.swarm.server.run_server``) and ``trainers`` trainers
(``swarmtrain.app.swarm.roles.run_trainer``), each a separate interpreter in its own process group
(``peers.dht.process.spawn_function``), admitted as ``swarmtrain run init`` would admit them
(``swarmtrain.simulation.credentials``); ``layout`` places them by hand instead (e.g. ``[3, 1]``),
and rebalancing (``swarmtrain.app.swarm.server``) may move them between stages as they train.
With ``kill_servers=K``, K servers are SIGKILLed at random
moments between 15 % and 60 % of the trainers' progress, never the last server of a stage; with
``chaos``, servers are killed, preempted and restarted as ``--chaos`` asks
(``swarmtrain.simulation.swarm_chaos``). When every
trainer is done, the servers are asked to leave (SIGTERM): the servers of each stage average a last
time and report a digest of their parameters, so ``params_identical`` says whether each stage's
surviving replicas are bit-identical. The final validation loss is that of one replica per stage,
composed in this process; with ``baseline``, the same stages train in this process on the same
micro-batches grouped into the same optimizer steps (``swarmtrain.app.swarm.roles.train_baseline``).

Every child reports on its own queue: a SIGKILLed peer that was writing to a shared queue would hold
its lock forever.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import random
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from peers.dht.process import process_context
from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError, SwarmError
from swarmtrain.core.peer_error import TRACEBACK, ErrorReports, report_error
from swarmtrain.core.swarm_config import SwarmConfig
from swarmtrain.simulation.chaos import ChaosSpec
from swarmtrain.simulation.credentials import admitted_configs
from swarmtrain.simulation.logs import quiet_logs
from swarmtrain.simulation.memory import RunMemory
from swarmtrain.simulation.runner import (
    child_log_level,
    loopback_copy,
    quiet_resource_tracker,
    start_bootstrap,
    tear_down,
)
from swarmtrain.simulation.swarm_chaos import ServerChaos
from swarmtrain.simulation.swarm_result import (
    SwarmResult,
    add_chaos,
    add_moves,
    collect_result,
    rates_around_moves,
)

__all__ = ["SwarmResult", "run_swarm_simulation", "spread_servers", "rates_around_moves", "KILL_WINDOW"]

logger = logging.getLogger(__name__)

#: kills happen at uniformly drawn moments in this range of the trainers' progress
KILL_WINDOW = (0.15, 0.6)


def spread_servers(servers: int, stages: int) -> list[int]:
    """The stage of each server: round-robin, so stage counts differ by at most one.

    Raises:
        ConfigError: fewer servers than stages.
    """
    if servers < stages:
        raise ConfigError(f"--peers {servers} cannot serve {stages} stages (one server per stage at least)")
    return [i % stages for i in range(servers)]


def _server_main(
    rank: int,
    stage: int,
    cfg_json: str,
    settings: dict[str, Any],
    q: Any,
    level: int,
    run_over: Any,
    lie: bool = False,
) -> None:
    """One stage server; it reports its outcome (its whole stage state) only when told to leave at
    the run's end (``run_over`` set): a server preempted mid-run is not read any more, and a report
    of megabytes would keep it from exiting (the queue's feeder thread waits for a reader).
    ``lie``: it corrupts its replies (``swarmtrain.simulation.attacks.stage_server``)."""
    from peers import GracefulExit
    from swarmtrain.app.swarm.server import run_server

    quiet_logs(level)
    try:
        if lie:
            from swarmtrain.simulation.attacks.stage_server import corrupt_stage_replies

            corrupt_stage_replies()
        cfg = Config.model_validate_json(cfg_json)
        with GracefulExit() as stop:
            out = run_server(
                cfg,
                SwarmConfig(**settings),
                stage,
                stop,
                on_ready=lambda pid, _stage: q.put(("ready", rank, pid)),
                on_move=lambda src, dst, at, serving: q.put(("moved", rank, (src, dst, at, serving))),
                on_serving=lambda k: q.put(("serving", rank, k)),
            )
        if run_over.is_set():
            q.put(("done", rank, asdict(out)))
    except BaseException as e:  # report, never hang the parent
        report_error(q, rank, f"server {rank}", e)


def _trainer_main(index: int, cfg_json: str, settings: dict[str, Any], q: Any, level: int) -> None:
    from swarmtrain.app.swarm.roles import run_trainer

    quiet_logs(level)
    try:
        cfg = Config.model_validate_json(cfg_json)
        out = run_trainer(
            cfg, SwarmConfig(**settings), index, on_progress=lambda i, loss: q.put(("step", index, i))
        )
        q.put(("done", index, asdict(out)))
    except BaseException as e:
        report_error(q, index, f"trainer {index}", e)


@dataclass
class _Child:
    name: str
    proc: Any
    q: Any
    stage: int = -1
    rank: int = -1
    ready: bool = False
    #: serving in step with its stage's replicas (not catching up); what lets another one of the
    #: stage go under chaos
    serving: bool = False
    progress: int = 0
    outcome: dict[str, Any] | None = None
    killed: bool = False
    #: its traceback text until its error line comes (``swarmtrain.core.peer_error``)
    errors: ErrorReports = field(default_factory=ErrorReports)

    def poll(self) -> None:
        """Drain this child's queue.

        Raises:
            PeerError: the child reported an error (with its traceback).
        """
        if self.killed:
            return
        while True:
            try:
                kind, sender, payload = self.q.get_nowait()
            except (queue_mod.Empty, OSError, ValueError):
                return
            if kind == TRACEBACK:
                self.errors.note(sender, payload)
            elif kind == "error":
                raise self.errors.error(sender, payload)
            if kind == "ready":
                self.ready = True
            elif kind == "step":
                self.progress = int(payload)
            elif kind == "serving":
                self.serving = True
            elif kind == "moved":  # it left its stage (serving_at None), or caught up with the new one
                self.stage, self.serving = int(payload[1]), payload[3] is not None
            elif kind == "done":
                self.outcome = payload


def _poll(children: list[_Child]) -> None:
    """Read every child's reports; a child that died before reporting (unless killed) is an error."""
    for c in children:
        c.poll()
        if not c.killed and c.outcome is None and not c.proc.alive:
            c.poll()  # it may have reported just before it exited
            if c.outcome is None:
                raise SwarmError(f"{c.name} exited with code {c.proc.exitcode} before reporting")


def _wait(children: list[_Child], until: Any, deadline: float, what: str) -> None:
    while True:
        _poll(children)
        if until():
            return
        if time.monotonic() > deadline:
            raise SwarmError(f"the swarm simulation timed out waiting for {what}")
        time.sleep(0.05)


def _placement(
    servers: int, stages: int, layout: list[int] | None, kill_servers: int, liars: int = 0
) -> list[int]:
    """The stage of each server (``layout`` or round-robin), checked against the kills and the lying
    servers asked for.

    Raises:
        ConfigError: a layout that does not fit, or more kills (or liars) than servers beyond one
            per stage.
    """
    if liars > servers - stages:
        raise ConfigError(
            f"--byzantine-servers {liars}: at most {servers - stages}, to keep an honest server per stage"
        )
    stage_of = spread_servers(servers, stages)
    if layout is not None:
        if len(layout) != stages or sum(layout) != servers or min(layout) < 1:
            raise ConfigError(f"layout {layout} does not place {servers} servers on {stages} stages")
        stage_of = [s for s, n in enumerate(layout) for _ in range(n)]
    if kill_servers > servers - stages:
        raise ConfigError(
            f"--kill-servers {kill_servers}: {servers} servers over {stages} stages leave "
            f"at most {servers - stages} that can die without emptying a stage"
        )
    return stage_of


def _train(
    srv: list[_Child],
    trn: list[_Child],
    total: int,
    kills: list[float],
    rng: random.Random,
    deadline: float,
    chaos: ServerChaos | None = None,
) -> list[str]:
    """Wait for the trainers, SIGKILLing a server at each of ``kills`` (fractions of ``total``
    micro-batches done) and running ``chaos``; returns who was killed."""
    killed: list[str] = []
    while not all(c.outcome is not None for c in trn):
        _poll(srv + trn)
        done = sum(c.progress for c in trn) / total
        while kills and done >= kills[0]:
            kills.pop(0)
            killed.append(_kill_one(srv, rng))
        if chaos is not None:
            chaos.tick(time.monotonic(), srv, all(c.progress >= 1 for c in trn), done)
        if time.monotonic() > deadline:
            raise SwarmError("the swarm simulation timed out waiting for the trainers")
        time.sleep(0.05)
    if chaos is not None:
        chaos.finish(time.monotonic())
    return killed


def _leave(spawner: _Spawner, alive: list[_Child], deadline: float) -> None:
    """The run is over: tell the servers still in it to leave, and wait for their reports."""
    # a server restarted late must have installed its SIGTERM handler to leave and report
    _wait(alive, lambda: all(c.ready for c in alive), deadline, "the restarted servers to start")
    spawner.run_over.set()
    for child in alive:
        child.proc.signal(signal.SIGTERM)
    _wait(alive, lambda: all(c.outcome is not None for c in alive), deadline, "the servers' reports")


def run_swarm_simulation(
    cfg: Config,
    settings: SwarmConfig,
    servers: int,
    *,
    kill_servers: int = 0,
    baseline: bool = False,
    timeout: float = 1800.0,
    layout: list[int] | None = None,
    chaos: ChaosSpec | None = None,
    byzantine_servers: int = 0,
) -> SwarmResult:
    """Run SWARM with ``servers`` stage servers and ``settings.trainers`` trainers on loopback
    (``layout``: servers per stage, summing to ``servers``; default round-robin; ``chaos``: servers
    killed, preempted and restarted while the trainers train; ``byzantine_servers=K``: ranks
    ``0..K-1`` send their replies x(-10), ``swarmtrain.simulation.attacks.stage_server``).

    Raises:
        ConfigError: too few servers for the stages, a layout that does not fit (``_placement``).
        SwarmError: a child reported an error, died before its report, or the run timed out.
    """
    from swarmtrain.app.swarm.roles import train_baseline

    stage_of = _placement(servers, settings.stages, layout, kill_servers, byzantine_servers)
    cfg = loopback_copy(cfg)
    quiet_resource_tracker()
    ctx = process_context()
    level = child_log_level()
    deadline = time.monotonic() + timeout
    procs: list[Any] = []
    phases: dict[str, float] = {}  # seconds: servers starting, training, servers' last sync and reports
    spawner = _Spawner(ctx, [], settings.model_dump(), level, procs)  # its configs once the bootstrap runs
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="swarmtrain-swarm-") as folder, spawner.memory:
        boot_cfg, cfgs = admitted_configs(cfg, servers + settings.trainers, Path(folder))
        bq = ctx.Queue()
        try:
            initial = start_bootstrap(boot_cfg, bq, level, None, procs, deadline)
            spawner.cfgs = _child_configs(cfgs, initial)
            srv = spawner.start_servers(stage_of, liars=byzantine_servers)
            _wait(srv, lambda: all(c.ready for c in srv), deadline, "the servers to start")
            phases["start"] = time.perf_counter() - t0
            trn = [spawner.trainer(t, servers + t) for t in range(settings.trainers)]
            t_train = time.time()
            sc = _server_chaos(chaos, cfg, spawner)
            killed = _train_with_kills(cfg, settings, srv, trn, kill_servers, deadline, sc)
            phases["train"] = time.perf_counter() - t0 - phases["start"]
            alive = [c for c in srv if not c.killed]
            _leave(spawner, alive, deadline)
            phases["leave"] = time.perf_counter() - t0 - phases["start"] - phases["train"]
        finally:
            tear_down(procs, bq)
    wall = time.perf_counter() - t0
    phases["teardown"] = wall - sum(phases.values())
    res = collect_result(cfg, settings, stage_of, trn, alive, killed, wall, phases, spawner)
    if sc is not None:
        add_chaos(res, sc, srv, servers)
    add_moves(res, settings, alive, trn, t_train)
    res.baseline_val_loss = train_baseline(cfg, settings)[0] if baseline else None
    return res


def _child_configs(cfgs: list[Config], initial_peers: list[str]) -> list[str]:
    """Each child's config, pointed at the bootstrap node, as JSON."""
    for c in cfgs:
        c.peers.initial_peers = initial_peers
    return [c.model_dump_json() for c in cfgs]


def _server_chaos(chaos: ChaosSpec | None, cfg: Config, spawner: _Spawner) -> ServerChaos | None:
    """The servers' chaos (kills, preemptions, restarts through ``spawner``), from now; ``None``: none."""
    if chaos is None:
        return None
    return ServerChaos(chaos, cfg.train.seed, spawner.server, time.monotonic(), cfg.peers.preempt_grace)


def _train_with_kills(
    cfg: Config,
    settings: SwarmConfig,
    srv: list[_Child],
    trn: list[_Child],
    kill_servers: int,
    deadline: float,
    sc: ServerChaos | None,
) -> list[str]:
    """Train until every trainer reported, SIGKILLing ``kill_servers`` servers at moments drawn in
    :data:`KILL_WINDOW` of the progress; returns the servers killed."""
    rng = random.Random(cfg.train.seed + 1)
    kill_at = sorted(rng.uniform(*KILL_WINDOW) for _ in range(kill_servers))
    return _train(srv, trn, settings.microbatches * settings.trainers, kill_at, rng, deadline, sc)


@dataclass
class _Spawner:
    """Starts the run's children, each with its own report queue; ``servers`` holds every server
    started, restarted incarnations included (after the first ones)."""

    ctx: Any
    cfgs: list[str]  # each child's config (JSON): the servers' by rank, then the trainers'
    settings: dict[str, Any]
    level: int
    procs: list[Any]
    servers: list[_Child] = field(default_factory=list)
    #: each rank's newest process (servers by rank, trainer ``t`` as rank ``servers + t``): what
    #: ``memory``, the run's memory figures (``swarmtrain.simulation.memory``), samples
    current: dict[int, Any] = field(default_factory=dict)
    memory: RunMemory = field(init=False)
    #: set before the servers are told to leave at the run's end: only then do they report
    run_over: Any = None
    #: ranks whose servers corrupt their replies (restarted incarnations too)
    liars: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        self.run_over = self.ctx.Event()
        self.memory = RunMemory(lambda: {r: p.pid for r, p in self.current.items()})

    def start_servers(self, stage_of: list[int], liars: int = 0) -> list[_Child]:
        """A server of each rank on its stage (``stage_of[rank]``); ranks below ``liars`` lie."""
        self.liars = frozenset(range(liars))
        for rank, stage in enumerate(stage_of):
            self.server(rank, stage)
        return self.servers

    def server(self, rank: int, stage: int) -> _Child:
        from peers import spawn_function

        q = self.ctx.Queue()
        lie = rank in self.liars
        args = (rank, stage, self.cfgs[rank], self.settings, q, self.level, self.run_over, lie)
        p = spawn_function(_server_main, args, name=f"server{rank}")
        self.procs.append(p)
        self.current[rank] = p
        self.servers.append(_Child(f"server{rank}", p, q, stage, rank=rank))
        return self.servers[-1]

    def trainer(self, index: int, cfg_index: int) -> _Child:
        from peers import spawn_function

        q = self.ctx.Queue()
        args = (index, self.cfgs[cfg_index], self.settings, q, self.level)
        p = spawn_function(_trainer_main, args, name=f"trainer{index}")
        self.procs.append(p)
        self.current[cfg_index] = p
        return _Child(f"trainer{index}", p, q)


def _kill_one(servers: list[Any], rng: random.Random) -> str:
    """SIGKILL a random server of a stage that keeps another one; returns its name."""
    alive: dict[int, list[_Child]] = {}
    for c in servers:
        if not c.killed:
            alive.setdefault(c.stage, []).append(c)
    pool = [c for cs in alive.values() if len(cs) >= 2 for c in cs]
    if not pool:
        raise SwarmError("no server can be killed without emptying a stage")
    victim = rng.choice(pool)
    victim.killed = True  # its queue is not read again: a SIGKILL mid-write would leave a torn message
    victim.proc.signal(signal.SIGKILL)
    logger.info("killed %s (stage %d)", victim.name, victim.stage)
    return f"{victim.name}.stage{victim.stage}"
