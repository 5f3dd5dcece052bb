"""A local multi-peer run: a bootstrap DHT node and N real peer processes on 127.0.0.1.

Each peer is a separate interpreter in its own process group (``peers.process.spawn_function``), with
its own hivemind DHT node and p2pd daemon; the peers find each other through the bootstrap node and
train one model with the configured strategy over ``peers.P2PCollective``. The parent collects each
peer's outcome through a queue (final validation loss, a digest of its parameters after every
committed sync, its byte ledger) and always tears every process group down.

``run_simulation`` is what ``swarmtrain simulate`` and the integration tests drive.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import queue as queue_mod
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError, PeerTimeoutError, SwarmError

if TYPE_CHECKING:
    from swarmtrain.app.data import BatchSampler

__all__ = [
    "PeerOutcome",
    "SimulationResult",
    "run_simulation",
    "param_digest",
    "shared_parameters",
    "attack_options",
]

logger = logging.getLogger(__name__)

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def param_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's bytes, in name order: equal digests mean bit-identical tensors."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def shared_parameters(strategy: Any, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters every peer must agree on: the strategy's global (anchor) parameters when it
    keeps them apart from the local model (DiLoCo, StreamingDiLoCo), else the model's own."""
    glob = getattr(strategy, "global_parameters", None)
    if callable(glob):
        return dict(glob())
    return dict(model.named_parameters())


@dataclass
class PeerOutcome:
    """What one peer reports at the end of its run."""

    rank: int
    peer_id: str
    steps: int
    tokens: int
    final_train_loss: float
    final_val_loss: float | None
    final_digest: str
    sync_digests: dict[int, str]  # round id -> parameter digest right after that committed sync
    committed_rounds: int
    failed_rounds: int
    peak_sync_bytes_sent: int  # the most bytes this peer sent in any single sync
    comm_wait_s: float  # time the training loop waited on communication (StepReport.extra)
    bytes_sent: int
    bytes_received: int
    ledger: dict[str, Any]
    wall_s: float
    banned: dict[str, str] = field(default_factory=dict)  # peer -> reason, this peer's view at the end
    late_rounds: int = 0  # rounds formed without this peer; it then adopted the state they committed
    # issue 6, attackers only: what the attack did (poisoned batches, collusion exchanges and failures)
    attack_stats: dict[str, int] = field(default_factory=dict)


@dataclass
class SimulationResult:
    """The outcome of one simulated run (one strategy/codec over N peers)."""

    strategy: str
    compressor: str
    peers: int
    steps: int
    tokens: int
    final_val_loss: float
    params_identical: bool
    bytes_sent_per_peer: float
    bytes_received_per_peer: float
    wall_s: float
    peak_sync_bytes_sent: int = 0  # the most bytes any peer sent in any single sync
    compute_utilization: float = 1.0  # 1 - (time waiting on communication / training wall time)
    outcomes: list[PeerOutcome] = field(default_factory=list)

    @property
    def bytes_per_token(self) -> float:
        """Bytes sent per peer per token that peer trained on."""
        per_peer_tokens = self.tokens / max(self.peers, 1)
        return self.bytes_sent_per_peer / max(per_peer_tokens, 1)

    def summary(self) -> dict[str, Any]:
        """Plain-data summary (no per-peer details)."""
        d = asdict(self)
        d.pop("outcomes")
        d["bytes_per_token"] = self.bytes_per_token
        return d


# ------------------------------------------------------------------------------ child processes
def _quiet_logs(level: int) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s")
    logging.getLogger("hivemind").setLevel(max(level, logging.ERROR))


def _bootstrap_main(cfg_json: str, q: Any, log_level: int = logging.ERROR) -> None:
    """A DHT bootstrap node: reports its multiaddrs, then serves until its group is terminated."""
    from peers import GracefulExit, PeerNode

    _quiet_logs(log_level)

    cfg = Config.model_validate_json(cfg_json)
    try:
        with GracefulExit() as stop, PeerNode(cfg.peers, role="bootstrap") as node:
            q.put(("bootstrap", -1, node.visible_maddrs))
            stop.wait(None)
    except BaseException as e:  # report, never hang the parent
        q.put(("error", -1, f"bootstrap: {type(e).__name__}: {e}"))


def _peer_main(rank: int, n_peers: int, cfg_json: str, q: Any, log_level: int = logging.ERROR) -> None:
    """One training peer: node + collective + trainer; reports progress and a final ``PeerOutcome``."""
    from peers import GracefulExit, P2PCollective, PeerNode, StateServer
    from peers.reducers import build_reducer
    from swarmtrain.app.trainer import StepInfo, Trainer
    from swarmtrain.app.volunteer import adopt_swarm_state, state_snapshot

    _quiet_logs(log_level)

    cfg = Config.model_validate_json(cfg_json)
    # malicious owners: ranks K..K+M-1 after K update attackers (ranks < K with --attack malicious_owner)
    first_owner_attacker = (
        cfg.simulation.attackers if cfg.simulation.attack not in ("none", "malicious_owner") else 0
    )
    bad_owner = first_owner_attacker <= rank < first_owner_attacker + cfg.simulation.malicious_owners
    bad_owner |= cfg.simulation.attack == "malicious_owner" and rank < cfg.simulation.attackers
    if cfg.peers.owner_check or bad_owner:  # issue 6: the guard signs with the node's identity file
        from peers.guard import ensure_signing_identity

        ensure_signing_identity(cfg.peers)
    try:
        with GracefulExit() as stop, PeerNode(cfg.peers, role="trainer") as node:
            guard = None
            if cfg.peers.owner_check or bad_owner:
                from peers.guard import build_guard

                owner_attack = None
                if bad_owner:
                    from swarmtrain.simulation.attacks import MaliciousOwner

                    opts: dict[str, Any] = {
                        k: v for k, v in cfg.simulation.attack_options.items() if k in ("mode", "scale")
                    }
                    owner_attack = MaliciousOwner(seed=rank, **opts)
                guard = build_guard(node, cfg.peers, owner_attack=owner_attack)
            collective = p2p = P2PCollective(
                node,
                min_peers=cfg.peers.min_peers,
                expected_peers=n_peers,
                join_window=cfg.peers.join_window,
                guard=guard,
            )
            reducer = build_reducer(cfg.peers.reducer, cfg.peers.byzantine_f, **cfg.peers.reducer_options)
            attacking = rank < cfg.simulation.attackers and cfg.simulation.attack not in (
                "none",
                "malicious_owner",
            )
            options = attack_options(cfg, n_peers)
            data_attack = attacking and _is_data_attack(cfg.simulation.attack, options)
            if attacking and not data_attack:  # issue 6: forge the updates this peer sends
                collective = _attacking_collective(cfg, node, collective, options, rank)
            trainer = Trainer(cfg, collective=collective, peer_index=rank, num_peers=n_peers, reducer=reducer)
            poisoned = None
            if data_attack:  # issue 6: train on poisoned batches; the trainer stays attack-free
                from swarmtrain.simulation.attacks import PoisonedBatches, build_attack

                options.setdefault("vocab_size", trainer.model.vocab_size)
                poisoned = PoisonedBatches(trainer.sampler, build_attack(cfg.simulation.attack, **options))
                trainer.sampler = cast("BatchSampler", poisoned)  # same interface, delegates the rest
            digests: dict[int, str] = {}
            counts = {"committed": 0, "failed": 0, "peak": 0, "late": 0}
            waited = [0.0]
            # a peer the others left out of a round catches up as a volunteer does (state download)
            server = StateServer(node, lambda: state_snapshot(trainer, p2p.round_id))

            def on_step(info: StepInfo) -> None:
                r = info.report
                waited[0] += float(r.extra.get("comm_wait_s", 0.0))
                if r.synced:
                    counts["peak"] = max(counts["peak"], r.bytes_sent)
                    if r.committed:
                        counts["committed"] += 1
                        digests[r.round_id] = param_digest(shared_parameters(trainer.strategy, trainer.model))
                        server.refresh()
                    else:
                        counts["failed"] += 1
                        t = cfg.peers.round_timeout  # as join: wait for the state the round committed
                        if r.late and adopt_swarm_state(
                            node, trainer, p2p, 2 * t, min_round=p2p.round_id, fresh_wait=t
                        ):
                            counts["late"] += 1
                            server.refresh()
                    node.publish(step=info.step, round=r.round_id, throughput=info.tokens_per_s)
                if info.step % cfg.train.log_interval == 0 or r.synced:
                    q.put(("step", rank, (info.step, info.loss)))
                if stop.requested:
                    raise KeyboardInterrupt

            t0 = time.perf_counter()
            result = trainer.fit(on_step)
            outcome = PeerOutcome(
                rank=rank,
                peer_id=node.peer_id,
                steps=result.steps,
                tokens=result.tokens,
                final_train_loss=result.final_train_loss,
                final_val_loss=result.final_val_loss,
                final_digest=param_digest(shared_parameters(trainer.strategy, trainer.model)),
                sync_digests=digests,
                committed_rounds=counts["committed"],
                failed_rounds=counts["failed"],
                peak_sync_bytes_sent=counts["peak"],
                comm_wait_s=waited[0],
                bytes_sent=node.ledger.sent,
                bytes_received=node.ledger.received,
                ledger=node.ledger.totals(),
                wall_s=time.perf_counter() - t0,
                banned=dict(guard.refresh()) if guard is not None else {},
                late_rounds=counts["late"],
                attack_stats=_attack_stats(collective, poisoned),
            )
            q.put(("done", rank, asdict(outcome)))
            # stay reachable until the parent has every outcome: a peer that leaves early would make
            # a slower peer's last round fail
            stop.wait(cfg.peers.round_timeout)
            server.close()
            collective.close()
    except BaseException as e:
        q.put(("error", rank, f"peer {rank}: {type(e).__name__}: {e}"))


def attack_options(cfg: Config, n_peers: int) -> dict[str, Any]:
    """The attack's options as configured, plus what a real run knows: ALIE's ``n`` and ``f``."""
    options: dict[str, Any] = dict(cfg.simulation.attack_options)
    if cfg.simulation.attack == "alie" and "z" not in options:
        options.setdefault("n_peers", n_peers)
        options.setdefault("n_byzantine", max(1, cfg.simulation.attackers))
    return options


#: strategies that exchange payloads by all-gather (no partition owners, no all-reduce contributions)
_GATHER_STRATEGIES = ("demo",)


def check_attack_fits_strategy(cfg: Config) -> None:
    """Refuse an attack that would silently do nothing under ``cfg.strategy.name``.

    Update-level attacks forge all-reduce contributions and ``malicious_owner`` corrupts a partition
    owner's aggregate; DeMo has neither (its sparse DCT payloads travel by all-gather), so with DeMo
    only the data-level ``label_flip`` acts.

    Raises:
        ConfigError: the attack cannot act on this strategy.
    """
    from swarmtrain.simulation.attacks import build_attack

    if not cfg.simulation.attackers and not cfg.simulation.malicious_owners:
        return
    if cfg.strategy.name not in _GATHER_STRATEGIES:
        return
    owner = cfg.simulation.malicious_owners > 0 or cfg.simulation.attack == "malicious_owner"
    update = cfg.simulation.attackers > 0 and cfg.simulation.attack not in ("none", "malicious_owner")
    if update and build_attack(cfg.simulation.attack, **dict(cfg.simulation.attack_options)).data_level:
        update = False
    if owner or update:
        name = "malicious_owner" if owner else cfg.simulation.attack
        raise ConfigError(
            f"attack {name!r} cannot act on strategy {cfg.strategy.name!r}: it exchanges sparse "
            "components by all-gather, with no all-reduce contributions or partition owners "
            "(use --attack label_flip, or a reduce-based strategy)"
        )


def _attack_stats(collective: Any, poisoned: Any) -> dict[str, int]:
    stats: dict[str, int] = {}
    if poisoned is not None:
        stats["poisoned_batches"] = int(poisoned.batches)
    colluders = getattr(collective, "colluders", None)
    if colluders is not None:
        stats["collusion_exchanges"] = int(colluders.exchanges)
        stats["collusion_failed"] = int(colluders.failed)
    return stats


def _is_data_attack(name: str, options: Mapping[str, Any]) -> bool:
    from swarmtrain.simulation.attacks import build_attack

    return bool(build_attack(name, **options).data_level)


def _attacking_collective(cfg: Config, node: Any, inner: Any, options: dict[str, Any], rank: int) -> Any:
    """Wrap ``inner`` so this peer forges its updates; ALIE/IPM attackers share a side channel.

    The colluders' channel is a second ``P2PCollective`` on the same node in its own rounds namespace
    (``<run>.colluders``), joined by the attackers only; each attacker calls it once per round.
    """
    from peers import P2PCollective
    from swarmtrain.simulation.attacks import AttackingCollective, Colluders, build_attack

    channel = None
    k = cfg.simulation.attackers
    if build_attack(cfg.simulation.attack, **options).omniscient and k >= 2:
        channel = P2PCollective(
            node,
            run_id=f"{node.run_id}.colluders",
            min_peers=k,
            expected_peers=k,
            join_window=cfg.peers.join_window,
        )
    colluders = Colluders(channel, timeout=min(10.0, cfg.peers.round_timeout))
    return AttackingCollective(inner, cfg.simulation.attack, options, seed=rank, colluders=colluders)


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
    on_progress: Callable[[int, int, float], None] | None = None,
) -> SimulationResult:
    """Train ``cfg`` with ``n_peers`` real peer processes on loopback and collect their outcomes.

    Args:
        cfg: the run configuration (strategy, codec, steps...). Peers listen on 127.0.0.1 only.
        n_peers: number of training peers (a bootstrap DHT node is started besides them).
        timeout: seconds for the whole run; every process is torn down after it.
        on_progress: called with (rank, step, loss) as peers report.

    Raises:
        SwarmError: a peer failed (its message says why), or the run timed out.
    """
    from peers import find_orphans, spawn_function

    if n_peers < 1:
        raise SwarmError("need at least one peer")
    check_attack_fits_strategy(cfg)
    cfg = cfg.model_copy(deep=True)
    cfg.peers.host_maddrs = list(LOOPBACK)
    cfg.peers.announce_maddrs = []
    cfg.train.progress = False
    if cfg.train.threads is None:
        cfg.train.threads = 1  # N peers share this machine's cores
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = []
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    try:
        level = logging.getLogger().getEffectiveLevel()
        level = level if level < logging.WARNING else logging.ERROR
        procs.append(spawn_function(_bootstrap_main, (cfg.model_dump_json(), q, level), name="bootstrap"))
        initial: list[str] = []
        while not initial:
            kind, rank, payload = _next(q, deadline)
            if kind == "error":
                raise SwarmError(str(payload))
            if kind == "bootstrap":
                initial = list(payload)
        cfg.peers.initial_peers = initial
        cfg_json = cfg.model_dump_json()
        for rank in range(n_peers):
            procs.append(spawn_function(_peer_main, (rank, n_peers, cfg_json, q, level), name=f"peer{rank}"))
        outcomes: dict[int, PeerOutcome] = {}
        while len(outcomes) < n_peers:
            kind, rank, payload = _next(q, deadline)
            if kind == "error":
                raise SwarmError(str(payload))
            if kind == "step" and on_progress is not None:
                on_progress(rank, int(payload[0]), float(payload[1]))
            elif kind == "done":
                outcomes[rank] = PeerOutcome(**payload)
            elif kind == "tick":
                dead = [p for p in procs[1:] if not p.alive and p.exitcode not in (0, None)]
                if dead:
                    raise SwarmError(f"a peer process died (exit code {dead[0].exitcode})")
    finally:
        _stop_all(procs)
        markers = [p.marker for p in procs]
        left = [o for m in markers for o in find_orphans(m)]
        if left:
            logger.error("processes left behind after the simulation: %s", [o.pid for o in left])
        q.close()
    wall = time.perf_counter() - t0
    ordered = [outcomes[r] for r in range(n_peers)]
    return SimulationResult(
        strategy=cfg.strategy.name,
        compressor=cfg.compression.codec,
        peers=n_peers,
        steps=ordered[0].steps,
        tokens=sum(o.tokens for o in ordered),
        final_val_loss=float(sum(o.final_val_loss or float("nan") for o in ordered) / n_peers),
        params_identical=params_identical(ordered),
        bytes_sent_per_peer=sum(o.bytes_sent for o in ordered) / n_peers,
        bytes_received_per_peer=sum(o.bytes_received for o in ordered) / n_peers,
        wall_s=wall,
        peak_sync_bytes_sent=max(o.peak_sync_bytes_sent for o in ordered),
        compute_utilization=1.0 - sum(o.comm_wait_s / max(o.wall_s, 1e-9) for o in ordered) / n_peers,
        outcomes=ordered,
    )


def _stop_all(procs: list[Any]) -> None:
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


def params_identical(outcomes: list[PeerOutcome]) -> bool:
    """True when every peer ends bit-identical and agreed after every round all of them committed."""
    if len({o.final_digest for o in outcomes}) != 1:
        return False
    common = set.intersection(*(set(o.sync_digests) for o in outcomes)) if outcomes else set()
    return all(len({o.sync_digests[r] for o in outcomes}) == 1 for r in common)
