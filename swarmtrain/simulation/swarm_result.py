"""The result of a simulated SWARM run and how it is put together from the children's reports: the
replicas compared per stage, the final model evaluated, samples, reroutes and bytes summed, the chaos's
counts and the servers' moves (``swarmtrain.simulation.swarm`` runs the children)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from swarmtrain.core.config import Config
from swarmtrain.core.swarm_config import SwarmConfig
from swarmtrain.simulation.memory import RunMemory
from swarmtrain.simulation.swarm_chaos import ServerChaos

__all__ = ["SwarmResult", "collect_result", "add_chaos", "add_moves", "is_replica", "rates_around_moves"]


class Child(Protocol):
    """What the result reads of a child process of the run (``swarmtrain.simulation.swarm``)."""

    name: str
    rank: int
    serving: bool
    killed: bool
    outcome: dict[str, Any] | None


class Spawned(Protocol):
    """What started the run's children: its memory figures and the ranks whose servers lied."""

    memory: RunMemory
    liars: frozenset[int]


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
    #: the trainers' replica checks (``peers.swarm.verify``): replies checked on a second replica,
    #: those that disagreed, disagreements no third replica settled, and the servers some trainer
    #: excluded (``server<rank>.stage<k>`` -> why)
    swarm_checked: int = 0
    swarm_mismatches: int = 0
    swarm_disputes: int = 0
    excluded_servers: int = 0
    excluded: dict[str, str] = field(default_factory=dict)
    #: ``--byzantine-servers``: the servers that corrupted their replies (``server<rank>.stage<k>``)
    byzantine: list[str] = field(default_factory=list)
    #: PSS in MiB (``swarmtrain.simulation.memory``): the whole run's peak, and each server's and
    #: trainer's peak (its process tree), averaged over them
    peak_rss_total_mib: float = 0.0
    rss_per_peer_mib: float = 0.0

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


def add_chaos(res: SwarmResult, sc: ServerChaos, srv: Sequence[Child], servers: int) -> None:
    """Copy the chaos's counts and timeline into ``res`` (``srv``: every server started, the first
    ``servers`` of them at the start)."""
    res.kills, res.preemptions, res.restarts = (sc.counts[k] for k in ("kill", "preempt", "restart"))
    res.killed += [f"server{e['rank']}.stage{e['stage']}" for e in sc.timeline if e["event"] == "kill"]
    res.missing_ranks = sorted(set(range(servers)) - {c.rank for c in srv if not c.killed})
    res.timeline = list(sc.timeline)
    res.restarts_caught_up = sum(1 for c in srv[servers:] if c.serving)


def collect_result(
    cfg: Config,
    settings: SwarmConfig,
    stage_of: list[int],
    trn: Sequence[Child],
    alive: Sequence[Child],
    killed: list[str],
    wall: float,
    phases: dict[str, float],
    spawned: Spawned,
) -> SwarmResult:
    """The run's result from the children's reports: replicas compared per stage, the final model
    (one replica per stage) evaluated, samples, reroutes and bytes summed, the memory measured."""
    touts = [c.outcome for c in trn if c.outcome is not None]
    souts = [(c, c.outcome) for c in alive if c.outcome is not None]
    identical, final_syncs, val = _compare_and_evaluate(cfg, settings, [o for _, o in souts])
    samples = sum(o["samples"] for o in touts)
    seconds = max((o["seconds"] for o in touts), default=0.0)
    bytes_sent = {f"server{c.name[6:]}.stage{o['stage']}": int(o["ledger"]["sent"]) for c, o in souts}
    bytes_sent.update({f"trainer{o['index']}": int(o["ledger"]["sent"]) for o in touts})
    last = [o["losses"][-1] for o in touts if o["losses"]]
    reasons = _summed(o["reroute_reasons"] for o in touts)
    by_kind = _summed(
        {k: cell["sent"] for k, cell in o["ledger"]["by_kind"].items()}
        for o in [*touts, *(o for _, o in souts)]
    )
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
        out_of_step=[f"{c.name}.stage{o['stage']}" for c, o in souts if not is_replica(o)],
        server_devices={f"server{c.name[6:]}.stage{o['stage']}": o.get("device") for c, o in souts},
        peak_rss_total_mib=spawned.memory.total_mib,
        rss_per_peer_mib=spawned.memory.per_peer_mib,
        byzantine=[f"server{r}.stage{stage_of[r]}" for r in sorted(spawned.liars)],
    )
    _add_checks(res, touts, alive)
    return res


def _add_checks(res: SwarmResult, touts: list[dict[str, Any]], servers: Sequence[Child]) -> None:
    """The trainers' replica checks, the excluded servers named by rank and stage where known."""
    names = {o["peer_id"]: f"server{c.name[6:]}.stage{o['stage']}" for c in servers if (o := c.outcome)}
    res.swarm_checked = sum(int(o.get("checked", 0)) for o in touts)
    res.swarm_mismatches = sum(int(o.get("mismatches", 0)) for o in touts)
    res.swarm_disputes = sum(int(o.get("disputes", 0)) for o in touts)
    for o in touts:
        for peer, why in o.get("excluded", {}).items():
            res.excluded.setdefault(names.get(peer, peer[:16]), why)
    res.excluded_servers = len(res.excluded)


def is_replica(outcome: dict[str, Any]) -> bool:
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


def add_moves(
    res: SwarmResult, settings: SwarmConfig, alive: Sequence[Child], trn: Sequence[Child], t0: float
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


def _compare_and_evaluate(
    cfg: Config, settings: SwarmConfig, souts: list[dict[str, Any]]
) -> tuple[bool, dict[str, int], float]:
    """Whether every stage's replicas (servers' reports) hold the same parameters, each stage's last
    sync group size, and the validation loss of the model put together from one replica per stage."""
    from swarmtrain.app.models.stages import build_stages
    from swarmtrain.app.swarm.roles import evaluate_stages, load_stage_state, stage_spec

    identical = True
    final_syncs: dict[str, int] = {}
    stages = build_stages(stage_spec(cfg), settings.stages, seed=cfg.train.seed)
    for s in range(settings.stages):
        mine = [o for o in souts if o["stage"] == s]
        final_syncs[f"stage{s}"] = max((o["final_group"] for o in mine), default=0)
        mine = [o for o in mine if is_replica(o)]
        identical &= bool(mine) and len({o["digest"] for o in mine}) == 1
        if mine:
            load_stage_state(stages[s], mine[0]["state"])
    return identical, final_syncs, evaluate_stages(stages, cfg)


def _summed(counts: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Counts per key, summed over ``counts``."""
    out: dict[str, int] = {}
    for one in counts:
        for key, n in one.items():
            out[key] = out.get(key, 0) + int(n)
    return out
