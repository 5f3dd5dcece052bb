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
import multiprocessing as mp
import queue as queue_mod
import random
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from swarmtrain.app.swarm.roles import SwarmSettings
from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError, SwarmError
from swarmtrain.core.peer_error import TRACEBACK, ErrorReports, report_error
from swarmtrain.simulation.chaos import ChaosSpec
from swarmtrain.simulation.credentials import admitted_configs
from swarmtrain.simulation.logs import quiet_logs
from swarmtrain.simulation.runner import (
    bootstrap_maddrs,
    bootstrap_main,
    loopback_copy,
    quiet_resource_tracker,
    stop_peers,
)
from swarmtrain.simulation.swarm_chaos import ServerChaos

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


@dataclass
class SwarmResult:
    """The outcome of one simulated SWARM run (the keys of ``simulate --json``)."""

    stages: int
    servers_per_stage: list[int]
    trainers: int
    codec: str
    microbatches: int
    samples: int
    final_val_loss: float
    throughput_samples_per_s: float
    rerouted: int
    lost_microbatches: int
    params_identical: bool
    bytes_sent_per_peer: dict[str, int]
    killed: list[str]
    wall_s: float
    baseline_val_loss: float | None = None
    rebalance_moves: int = 0
    final_syncs: dict[str, int] = field(default_factory=dict)
    reroute_reasons: dict[str, int] = field(default_factory=dict)
    #: ledger bytes sent by all reporting peers, per kind (activations, gradients, stage averaging...)
    bytes_sent_by_kind: dict[str, int] = field(default_factory=dict)
    phase_s: dict[str, float] = field(default_factory=dict)
    train_loss_last: float | None = None
    #: micro-batches per trainer per optimizer step (the baseline steps on the same ones)
    accumulate: int = 1
    #: optimizer steps the surviving servers took (each stage's replicas take every step together)
    steps_taken: int = 0
    #: steps a surviving server took on its own gradients because its stage's round failed
    step_failures: int = 0
    #: backwards a server was asked for again and answered without accumulating them twice
    duplicate_backwards: int = 0
    #: micro-batches a trainer fed again before closing their step: a server that died (or fell
    #: behind) took their gradients with it (``peers.swarm.client``)
    fed_again: int = 0
    #: servers per stage at the end (after rebalancing moves; the killed ones not counted)
    servers_per_stage_end: list[int] = field(default_factory=list)
    #: every move: ``server``, ``src``, ``dst``, ``at_s`` / ``serving_at_s`` (seconds into training)
    moves: list[dict[str, Any]] = field(default_factory=list)
    #: samples per second the trainers completed before the first move and after the last mover
    #: served again (``None`` without moves)
    throughput_before_moves: float | None = None
    throughput_after_moves: float | None = None
    #: ``--chaos``: servers SIGKILLed, SIGTERMed and started again, and when (``simulation.chaos``)
    kills: int = 0
    preemptions: int = 0
    restarts: int = 0
    #: servers that died unasked (always 0: one is an error here, ``SwarmError``)
    deaths: int = 0
    #: server ranks with no process at the end (went and not restarted)
    missing_ranks: list[int] = field(default_factory=list)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    #: servers that ended holding no replica of their stage (restarted too late to catch up, their
    #: last average met nobody): not compared, not evaluated
    out_of_step: list[str] = field(default_factory=list)
    #: restarted servers that caught up with their stage and served again
    restarts_caught_up: int = 0
    #: the device each surviving server's stage parameters were on when it left (``None``: not said)
    server_devices: dict[str, str | None] = field(default_factory=dict)

    @property
    def rounds_committed(self) -> int:
        """A SWARM stage's rounds are its replicas' gradient averages, one per optimizer step."""
        return self.steps_taken

    @property
    def rounds_failed(self) -> int:
        return self.step_failures

    def summary(self) -> dict[str, Any]:
        """The JSON report."""
        out: dict[str, Any] = {"strategy": "swarm", **asdict(self)}
        return out


def _server_main(
    rank: int, stage: int, cfg_json: str, settings: dict[str, Any], q: Any, level: int, run_over: Any
) -> None:
    """One stage server; it reports its outcome (its whole stage state) only when told to leave at
    the run's end (``run_over`` set): a server preempted mid-run is not read any more, and a report
    of megabytes would keep it from exiting (the queue's feeder thread waits for a reader)."""
    from peers import GracefulExit
    from swarmtrain.app.swarm.server import run_server

    quiet_logs(level)
    try:
        cfg = Config.model_validate_json(cfg_json)
        with GracefulExit() as stop:
            out = run_server(
                cfg,
                SwarmSettings(**settings),
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
            cfg, SwarmSettings(**settings), index, on_progress=lambda i, loss: q.put(("step", index, i))
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


def _placement(servers: int, stages: int, layout: list[int] | None, kill_servers: int) -> list[int]:
    """The stage of each server (``layout`` or round-robin), checked against the kills asked for.

    Raises:
        ConfigError: a layout that does not fit, or more kills than servers beyond one per stage.
    """
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
    settings: SwarmSettings,
    servers: int,
    *,
    kill_servers: int = 0,
    baseline: bool = False,
    timeout: float = 1800.0,
    layout: list[int] | None = None,
    chaos: ChaosSpec | None = None,
) -> SwarmResult:
    """Run SWARM with ``servers`` stage servers and ``settings.trainers`` trainers on loopback
    (``layout``: servers per stage, summing to ``servers``; default round-robin; ``chaos``: servers
    killed, preempted and restarted while the trainers train).

    Raises:
        ConfigError: too few servers for the stages, a layout that does not fit, or more kills than
            servers beyond one per stage.
        SwarmError: a child reported an error, died before its report, or the run timed out.
    """
    from peers import find_orphans, spawn_function
    from swarmtrain.app.swarm.roles import train_baseline

    stage_of = _placement(servers, settings.stages, layout, kill_servers)
    cfg = loopback_copy(cfg)
    quiet_resource_tracker()
    ctx = mp.get_context("spawn")
    rng = random.Random(cfg.train.seed + 1)
    level = logging.getLogger().getEffectiveLevel()
    level = level if level < logging.WARNING else logging.ERROR
    sdict = asdict(settings)
    deadline = time.monotonic() + timeout
    procs: list[Any] = []
    phases: dict[str, float] = {}  # seconds: servers starting, training, servers' last sync and reports
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="swarmtrain-swarm-") as folder:
        boot_cfg, cfgs = admitted_configs(cfg, servers + settings.trainers, Path(folder))
        bq = ctx.Queue()
        try:
            procs.append(
                spawn_function(bootstrap_main, (boot_cfg.model_dump_json(), bq, level), name="bootstrap")
            )
            initial = bootstrap_maddrs(bq, deadline)
            for rc in cfgs:
                rc.peers.initial_peers = initial
            spawner = _Spawner(ctx, [c.model_dump_json() for c in cfgs], sdict, level, procs)
            srv = spawner.servers
            for r, stage in enumerate(stage_of):
                spawner.server(r, stage)
            _wait(srv, lambda: all(c.ready for c in srv), deadline, "the servers to start")
            phases["start"] = time.perf_counter() - t0
            trn = [spawner.trainer(t, servers + t) for t in range(settings.trainers)]
            t_train = time.time()
            total = settings.microbatches * settings.trainers
            sc = None
            if chaos is not None:
                grace = cfg.peers.preempt_grace
                sc = ServerChaos(chaos, cfg.train.seed, spawner.server, time.monotonic(), grace)
            kill_at = sorted(rng.uniform(*KILL_WINDOW) for _ in range(kill_servers))
            killed = _train(srv, trn, total, kill_at, rng, deadline, sc)
            phases["train"] = time.perf_counter() - t0 - phases["start"]
            alive = [c for c in srv if not c.killed]
            _leave(spawner, alive, deadline)
            phases["leave"] = time.perf_counter() - t0 - phases["start"] - phases["train"]
        finally:
            stop_peers(procs)
            left = [o for p in procs for o in find_orphans(p.marker)]
            if left:
                logger.error("processes left behind after the swarm simulation: %s", [o.pid for o in left])
    wall = time.perf_counter() - t0
    phases["teardown"] = wall - sum(phases.values())
    res = _result(cfg, settings, stage_of, trn, alive, killed, wall, phases)
    if sc is not None:
        _add_chaos(res, sc, srv, servers)
    _add_moves(res, settings, alive, trn, t_train)
    if baseline:
        res.baseline_val_loss, _ = train_baseline(cfg, settings)
    return res


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
    #: set before the servers are told to leave at the run's end: only then do they report
    run_over: Any = None

    def __post_init__(self) -> None:
        self.run_over = self.ctx.Event()

    def server(self, rank: int, stage: int) -> _Child:
        from peers import spawn_function

        q = self.ctx.Queue()
        args = (rank, stage, self.cfgs[rank], self.settings, q, self.level, self.run_over)
        p = spawn_function(_server_main, args, name=f"server{rank}")
        self.procs.append(p)
        self.servers.append(_Child(f"server{rank}", p, q, stage, rank=rank))
        return self.servers[-1]

    def trainer(self, index: int, cfg_index: int) -> _Child:
        from peers import spawn_function

        q = self.ctx.Queue()
        args = (index, self.cfgs[cfg_index], self.settings, q, self.level)
        p = spawn_function(_trainer_main, args, name=f"trainer{index}")
        self.procs.append(p)
        return _Child(f"trainer{index}", p, q)


def _add_chaos(res: SwarmResult, sc: ServerChaos, srv: list[_Child], servers: int) -> None:
    """Copy the chaos's counts and timeline into ``res`` (``srv``: every server started, the first
    ``servers`` of them at the start)."""
    res.kills, res.preemptions, res.restarts = (sc.counts[k] for k in ("kill", "preempt", "restart"))
    res.killed += [f"server{e['rank']}.stage{e['stage']}" for e in sc.timeline if e["event"] == "kill"]
    res.missing_ranks = sorted(set(range(servers)) - {c.rank for c in srv if not c.killed})
    res.timeline = list(sc.timeline)
    res.restarts_caught_up = sum(1 for c in srv[servers:] if c.serving)


def _result(
    cfg: Config,
    settings: SwarmSettings,
    stage_of: list[int],
    trn: list[_Child],
    alive: list[_Child],
    killed: list[str],
    wall: float,
    phases: dict[str, float],
) -> SwarmResult:
    """The run's result from the children's reports: replicas compared per stage, the final model
    (one replica per stage) evaluated, samples, reroutes and bytes summed."""
    from swarmtrain.app.models.stages import build_stages
    from swarmtrain.app.swarm.roles import evaluate_stages, load_stage_state, stage_spec

    touts = [c.outcome for c in trn if c.outcome is not None]
    souts = [(c, c.outcome) for c in alive if c.outcome is not None]
    identical = True
    final_syncs: dict[str, int] = {}
    stages = build_stages(stage_spec(cfg), settings.stages, seed=cfg.train.seed)
    for s in range(settings.stages):
        mine = [o for _, o in souts if o["stage"] == s]
        final_syncs[f"stage{s}"] = max((o["final_group"] for o in mine), default=0)
        mine = [o for o in mine if _replica(o)]
        identical &= bool(mine) and len({o["digest"] for o in mine}) == 1
        if mine:
            load_stage_state(stages[s], mine[0]["state"])
    val = evaluate_stages(stages, cfg)
    samples = sum(o["samples"] for o in touts)
    seconds = max((o["seconds"] for o in touts), default=0.0)
    bytes_sent = {f"server{c.name[6:]}.stage{o['stage']}": int(o["ledger"]["sent"]) for c, o in souts}
    bytes_sent.update({f"trainer{o['index']}": int(o["ledger"]["sent"]) for o in touts})
    last = [o["losses"][-1] for o in touts if o["losses"]]
    reasons: dict[str, int] = {}
    for o in touts:
        for why, n in o["reroute_reasons"].items():
            reasons[why] = reasons.get(why, 0) + int(n)
    by_kind: dict[str, int] = {}
    for o in [*touts, *(o for _, o in souts)]:
        for kind, cell in o["ledger"]["by_kind"].items():
            by_kind[kind] = by_kind.get(kind, 0) + int(cell["sent"])
    res = SwarmResult(
        stages=settings.stages,
        servers_per_stage=[stage_of.count(s) for s in range(settings.stages)],
        trainers=settings.trainers,
        codec=settings.codec,
        microbatches=settings.microbatches * settings.trainers,
        samples=samples,
        final_val_loss=val,
        throughput_samples_per_s=samples / seconds if seconds > 0 else 0.0,
        rerouted=sum(o["rerouted"] for o in touts),
        lost_microbatches=settings.microbatches * settings.trainers - sum(o["completed"] for o in touts),
        params_identical=identical,
        bytes_sent_per_peer=bytes_sent,
        killed=killed,
        wall_s=wall,
        final_syncs=final_syncs,
        phase_s=phases,
        reroute_reasons=reasons,
        bytes_sent_by_kind=by_kind,
        train_loss_last=sum(last) / len(last) if last else None,
        accumulate=settings.accumulate,
        steps_taken=max((int(o["version"]) for _, o in souts), default=0),
        step_failures=sum(int(o["step_failures"]) for _, o in souts),
        duplicate_backwards=sum(int(o["duplicates"]) for _, o in souts),
        fed_again=sum(int(o.get("fed_again", 0)) for o in touts),
        out_of_step=[f"{c.name}.stage{o['stage']}" for c, o in souts if not _replica(o)],
        server_devices={f"server{c.name[6:]}.stage{o['stage']}": o.get("device") for c, o in souts},
    )
    return res


def _replica(outcome: dict[str, Any]) -> bool:
    """Whether a server's report holds its stage's parameters: it served in step when asked to leave,
    or its last average met another server (a late one takes their parameters there). A server
    restarted so late that no step came to catch up on, and whose last average met nobody, holds only
    its initial parameters: no replica, left out of the comparison (``out_of_step``)."""
    return bool(outcome.get("in_step", True)) or int(outcome["final_group"]) >= 2


def rates_around_moves(
    done: list[tuple[float, int]], moves: list[tuple[float, float]], end: float
) -> tuple[float | None, float | None]:
    """Samples per second completed before the first move started and after the last mover served
    again. ``done``: ``(time, samples)`` per completed micro-batch; ``moves``: ``(left, serving)``;
    ``end``: when training ended. ``(None, None)`` without moves; a side without samples is ``None``."""
    if not moves:
        return None, None
    start = min(t for t, _ in done) if done else 0.0
    first, last = min(m[0] for m in moves), max(m[1] for m in moves)

    def rate(lo: float, hi: float) -> float | None:
        n = sum(k for t, k in done if lo < t <= hi)
        return n / (hi - lo) if n and hi > lo else None

    return rate(start, first), rate(last, end)


def _add_moves(
    res: SwarmResult, settings: SwarmSettings, alive: list[_Child], trn: list[_Child], t0: float
) -> None:
    """The moves the surviving servers made, where the servers ended, and the rates around the moves."""
    souts = [(c, c.outcome) for c in alive if c.outcome is not None]
    res.servers_per_stage_end = [sum(1 for _, o in souts if o["stage"] == s) for s in range(settings.stages)]
    moves = [(c.name, m) for c, o in souts for m in o["moves"]]
    res.rebalance_moves = len(moves)
    res.moves = [
        {"server": name, "src": m["src"], "dst": m["dst"]}
        | {"at_s": m["at"] - t0, "serving_at_s": None if m["serving_at"] is None else m["serving_at"] - t0}
        for name, m in sorted(moves, key=lambda x: x[1]["at"])
    ]  # serving_at_s None: it never caught up with its new stage
    touts = [c.outcome for c in trn if c.outcome is not None]
    done = [(t, o["samples"] // max(1, o["completed"])) for o in touts for t in o["done_at"]]
    end = max((t for t, _ in done), default=t0)
    spans = [(m["at"], end if m["serving_at"] is None else m["serving_at"]) for _, m in moves]
    res.throughput_before_moves, res.throughput_after_moves = rates_around_moves(done, spans, end)


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
