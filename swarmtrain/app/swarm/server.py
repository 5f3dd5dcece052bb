"""A SWARM stage server's whole life in one process: pick a stage, serve it, catch up, move, leave.

* **Pick**: ``stage=None`` (``--stage auto``) takes the bottleneck stage of the live servers' records
  (``peers.swarm.rebalance.bottleneck_stage``).
* **Serve** (``peers.swarm.server.StageServer``): at every optimizer step the stage's replicas sum
  their accumulated gradients (``peers.swarm.replicas.ReplicaSync.sum_grads``) and all take the same
  step. While a server of the stage announces it is catching up (and every :data:`VOUCH_EVERY` steps
  anyway) each replica serves a snapshot of the stage (parameters and optimizer state) after every
  step and vouches for its digest: replicas that step together hold the same snapshot at the same
  step, so their vouches agree, and nobody copies its state at every step for nothing.
* **Catch up**: a server that joins a stage whose replicas already stepped, that moved there, or that
  finds itself behind (it missed a step) follows the stage's steps without serving and replays them
  onto a vouched snapshot (``StageServer.catch_up``): it serves again bit-identical to the others.
* **Move** (``peers.swarm.rebalance.Rebalancer``): every :data:`CHECK_S` seconds each server reads
  the live servers' records; when the same move was planned for ``patience`` seconds and this server
  is the one to move, it stops at the next step boundary (``retire_after_step``), opens the new
  stage (announced as catching up), keeps refusing its old stage's requests as ``busy`` for a moment
  (trainers whose directory is a second old reroute at once instead of excluding it), then closes
  the old stage and catches up with the new one.
* **Leave** (``stop`` set): a server holding gradients of micro-batches of the current step stays
  for that step's close (up to :data:`FINISH_STEP_S`, refusing new micro-batches), so the step
  keeps them; then one last parameter average with the stage's servers that leave with it,
  so the replicas of a stage end identical whatever happened (a server behind or still catching up
  takes the others' mean without adding its own).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from swarmtrain.app.models.stages import GPTStage, build_stages
from swarmtrain.app.peer.preemption import LEAVE_RESERVE_S
from swarmtrain.app.swarm.roles import (
    ServerOutcome,
    optimizer_for,
    stage_digest,
    stage_limits,
    stage_spec,
    tensor_bytes,
)
from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.swarm_config import SwarmConfig

if TYPE_CHECKING:
    from peers.swarm.server import Stopper

__all__ = ["run_server", "CHECK_S", "VOUCH_EVERY", "MoveCallback"]

logger = logging.getLogger(__name__)

#: seconds between two looks at the live servers' records (rebalancing, falling behind)
CHECK_S = 1.0
#: seconds a leaving server waits at most for the close of a step it holds gradients of
FINISH_STEP_S = 10.0
#: a replica serves and vouches for a snapshot of its stage every this many optimizer steps (and after
#: every step while a server of its stage catches up)
VOUCH_EVERY = 16
#: seconds a moving server waits for its stage's next step before it gives the move up
RETIRE_WAIT_S = 30.0
#: seconds a moved server keeps refusing its old stage's requests as busy before closing it
HANDOVER_S = 2.0
#: seconds a catching-up server waits for one snapshot download
FETCH_TIMEOUT_S = 20.0

_COUNTS = ("served", "refused", "duplicates", "step_failures")
#: ``on_move(src, dst, moved_at, serving_at)``: wall-clock seconds (``time.time()``); called when the
#: server left ``src`` (``serving_at`` None) and again once it caught up with ``dst``
MoveCallback = Callable[[int, int, float, float | None], None]


@dataclass
class _Stage:
    """The stage this process serves now."""

    index: int
    module: GPTStage
    sync: Any  # peers.swarm.replicas.ReplicaSync
    server: Any  # peers.swarm.server.StageServer
    catching: threading.Thread | None = None
    #: a server of this stage is catching up: snapshot after every step (set by the watch loop)
    wanted: list[bool] = field(default_factory=lambda: [False])
    moves: list[dict[str, Any]] = field(default_factory=list)
    #: counts of the stages served before this one (``served``, ``refused``, ...)
    carried: dict[str, int] = field(default_factory=dict)

    def count(self, name: str) -> int:
        """``name`` (a ``StageServer`` counter) over every stage this process served."""
        return self.carried.get(name, 0) + int(getattr(self.server, name))

    def catching_up(self) -> bool:
        return self.catching is not None and self.catching.is_alive()


def _live_servers(node: Any, stages: int) -> list[Any]:
    """The live servers' records as ``ServerInfo`` (malformed ones skipped; none when the DHT is slow)."""
    from peers.swarm.routing import server_from_record
    from swarmtrain.core.errors import SwarmError

    try:
        recs = node.live_peers(timeout=5.0)
    except SwarmError:
        return []
    out = []
    for r in recs:
        try:
            info = server_from_record(r.peer_id, r.role, r.throughput, r.extra, stages)
        except SwarmError:
            continue
        if info is not None:
            out.append(info)
    return out


def _open_stage(
    node: Any, cfg: Config, settings: SwarmConfig, k: int, stop: Stopper, *, late: bool
) -> _Stage:
    """Build stage ``k``, start serving it, and (``late``) catch up with its replicas in a thread."""
    from compression import build_compressor
    from peers.swarm.replicas import ReplicaSync
    from peers.swarm.server import StageServer, StageServerConfig
    from swarmtrain.app.train.trainer import resolve_device

    spec = stage_spec(cfg)
    module: GPTStage = build_stages(spec, settings.stages, seed=cfg.train.seed)[k]
    module.to(resolve_device(cfg.train.device)).train()  # built on the host with the run's seed, then moved
    optimizer = optimizer_for(module, cfg)
    own = {"seed": cfg.train.seed, "peer": node.peer_id}  # its own random draws (compression.peer_seed)
    codec = build_compressor(cfg.compression.model_copy(update={"codec": settings.codec}), **own)
    sync_codec = build_compressor(cfg.compression.model_copy(update={"codec": settings.sync_codec}), **own)
    params = dict(module.named_parameters())
    sync = ReplicaSync(node, k, params, sync_codec, period=settings.sync_period, optimizer=optimizer)
    scfg = StageServerConfig(
        stage_limits(spec, k, settings, cfg),
        max_queue=settings.max_queue,
        accumulate=settings.accumulate,
        closes=settings.trainers,
        device_s=settings.device_s,
    )
    built: list[Any] = []  # the worker may call the hook before the constructor returns
    vouched, wanted = [0], [False]

    def between_requests() -> None:  # replicas at the same step vouch for the same snapshot
        if not built or built[0].steps.syncing:
            return
        version = built[0].version
        if version > vouched[0] and (wanted[0] or version % VOUCH_EVERY == 0):
            vouched[0] = version
            sync.vouch(version)

    server = StageServer(
        node, module, optimizer, codec, scfg, between_requests=between_requests, step_sync=sync.sum_grads
    )
    built.append(server)
    stage = _Stage(k, module, sync, server, wanted=wanted)
    if late:
        _start_catch_up(stage, stop)
    return stage


def _start_catch_up(stage: _Stage, stop: Stopper) -> None:
    def fetch(since: int) -> tuple[int, Callable[[], None]]:
        tensors, step = stage.sync.fetch(since, FETCH_TIMEOUT_S)
        return step, lambda: stage.sync.load(tensors)

    stage.catching = threading.Thread(
        target=stage.server.catch_up, args=(fetch, stop), name="swarmtrain-catch-up", daemon=True
    )
    stage.catching.start()


def _close_stage(stage: _Stage) -> None:
    stage.server.stop()
    stage.sync.close()


def _move(
    node: Any,
    cfg: Config,
    settings: SwarmConfig,
    cur: _Stage,
    dst: int,
    stop: Stopper,
) -> _Stage | None:
    """Leave ``cur`` at its next step boundary for stage ``dst``; returns the new stage (catching up
    in a thread), or ``None`` when no step came to leave at (the move is given up)."""
    cur.server.retire_after_step()
    if not cur.server.retired.wait(RETIRE_WAIT_S) and cur.server.cancel_retire():
        logger.info("stage %d: no step to move at within %.0f s; staying", cur.index, RETIRE_WAIT_S)
        return None
    moved_at = time.time()
    new = _open_stage(node, cfg, settings, dst, stop, late=True)
    stop.wait(HANDOVER_S)
    _close_stage(cur)
    new.moves = [*cur.moves, {"src": cur.index, "dst": dst, "at": moved_at, "serving_at": None}]
    new.carried = {n: cur.count(n) for n in _COUNTS}
    logger.info("moved from stage %d to stage %d; catching up", cur.index, dst)
    return new


def _watch(
    node: Any,
    cfg: Config,
    settings: SwarmConfig,
    cur: _Stage,
    stop: Stopper,
    on_move: MoveCallback | None,
    on_serving: Callable[[int], None] | None = None,
) -> _Stage:
    """Until ``stop``: catch up when behind, move when rebalancing says so. Returns the stage served
    at the end. ``on_serving(stage)`` once the first stage serves caught up (at once when it started
    in step with its replicas, after the catch-up of a late start)."""
    from peers.swarm.rebalance import Rebalancer

    announced = False

    rebalancer = None
    if settings.rebalance:
        rebalancer = Rebalancer(settings.stages, settings.hysteresis, settings.patience, settings.cooldown)
    while True:
        if not announced and not cur.catching_up():
            announced = True
            if on_serving is not None:
                on_serving(cur.index)
        if stop.wait(CHECK_S):
            break
        last = cur.moves[-1] if cur.moves else None
        if last is not None and last["serving_at"] is None and not cur.catching_up():
            serving = time.time()  # caught up (within CHECK_S): it serves its new stage
            last["serving_at"] = serving
            if on_move is not None:
                on_move(last["src"], last["dst"], last["at"], serving)
        if cur.server.steps.behind and not cur.catching_up():
            logger.warning("stage %d: behind the stage's steps; catching up", cur.index)
            _start_catch_up(cur, stop)
        live = _live_servers(node, settings.stages)
        cur.wanted[0] = any(s.syncing and s.stage == cur.index and s.peer_id != node.peer_id for s in live)
        if rebalancer is None or cur.catching_up():
            continue
        now = time.monotonic()
        move = rebalancer.observe(live, now)
        if move is None or move.peer_id != node.peer_id or not rebalancer.may_move(now):
            continue
        logger.info(
            "rebalancing: stage %d -> %d (pipeline %.1f -> %.1f samples/s)",
            move.src,
            move.dst,
            move.rate_before,
            move.rate_after,
        )
        new = _move(node, cfg, settings, cur, move.dst, stop)
        if new is None:
            continue
        cur = new
        rebalancer.moved(time.monotonic())
        if on_move is not None:  # it counts for its new stage from now on (a kill must not empty one)
            on_move(move.src, move.dst, cur.moves[-1]["at"], None)
    return cur


def _leave(node: Any, cfg: Config, cur: _Stage) -> tuple[Any, bool]:
    """Leave the stage ``cur`` within the preemption grace: close the step in progress, then average
    a last time with its servers that leave too. Returns the final round and whether this server
    was behind (its parameters are then not counted in that round)."""
    from peers.swarm.replicas import FINAL_ROUND
    from swarmtrain.app.swarm.roles import final_sync

    # told to leave (the run's end, or a preemption notice): done within the grace, less a reserve
    leave_by = time.monotonic() + cfg.peers.preempt_grace - LEAVE_RESERVE_S
    # micro-batches of the current step served here count in the trainers' step: stay for its
    # close (refusing new ones) so their gradients join the stage's sum; half the time left at most
    cur.server.stop(finish_step=min(FINISH_STEP_S, max(0.0, leave_by - time.monotonic()) / 2))
    # still catching up (a late start or restart, no snapshot loaded yet): its parameters may be
    # its initial ones even when it saw no step it missed
    behind = bool(cur.server.steps.behind or cur.server.steps.syncing or cur.catching_up())
    # a server that missed a step holds parameters the stage moved on from: it takes the others'
    final = final_sync(node, cur.sync, FINAL_ROUND, weight=0.0 if behind else 1.0, deadline=leave_by)
    cur.sync.close()
    return final, behind


def _outcome(node: Any, cur: _Stage, final: Any, behind: bool) -> ServerOutcome:
    """What a server that left stage ``cur`` reports: its counters, syncs, digest and state."""
    with torch.no_grad():
        state = {name: tensor_bytes(v) for name, v in cur.module.state_dict().items()}
    return ServerOutcome(
        stage=cur.index,
        peer_id=node.peer_id,
        served=cur.count("served"),
        refused=cur.count("refused"),
        version=cur.server.version,
        duplicates=cur.count("duplicates"),
        step_failures=cur.count("step_failures"),
        syncs_committed=cur.sync.committed,
        syncs_failed=cur.sync.failed,
        final_sync=final.committed,
        final_group=len(final.participants) if final.committed else 0,
        digest=stage_digest(cur.module),
        ledger=node.ledger.totals(),
        state=state,
        moves=cur.moves,
        in_step=not behind,
        device=str(next(cur.module.parameters()).device),
    )


def run_server(
    cfg: Config,
    settings: SwarmConfig,
    stage: int | None,
    stop: Stopper,
    on_ready: Callable[[str, int], None] | None = None,
    on_move: MoveCallback | None = None,
    on_serving: Callable[[int], None] | None = None,
    on_started: Callable[[list[str]], None] | None = None,
) -> ServerOutcome:
    """Serve stage ``stage`` (``None``: the bottleneck stage) until ``stop`` is set (a
    ``threading.Event`` or ``peers.GracefulExit``), moving between stages
    when rebalancing says so, then average a last time with the stage's servers that leave with it.
    ``on_ready(peer_id, stage)`` once it serves; ``on_serving(stage)`` once it also caught up with
    the stage's replicas (a late start downloads their state first); ``on_started(maddrs)`` once
    its node is up, with the multiaddrs others pass as ``--initial-peers``.

    Raises:
        ConfigError: a bad stage or codec.
    """
    from peers.dht.node import PeerNode
    from peers.swarm.rebalance import bottleneck_stage

    if stage is not None and not 0 <= stage < settings.stages:
        raise ConfigError(f"--stage {stage} is outside [0, {settings.stages})")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    with PeerNode(cfg.peers, role="server", heartbeat_ttl=6.0) as node:
        if on_started is not None:
            on_started(list(node.visible_maddrs))
        live = _live_servers(node, settings.stages)
        k = bottleneck_stage(live, settings.stages) if stage is None else stage
        late = any(s.stage == k and s.version > 0 for s in live)
        cur = _open_stage(node, cfg, settings, k, stop, late=late)
        if on_ready is not None:
            on_ready(node.peer_id, k)
        cur = _watch(node, cfg, settings, cur, stop, on_move, on_serving)
        final, behind = _leave(node, cfg, cur)
        return _outcome(node, cur, final, behind)
