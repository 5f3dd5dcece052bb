"""The two SWARM roles a peer can take, and the single-process reference they are compared with.

* the server (``swarmtrain.app.swarm.server.run_server``): build stage ``k`` of the run's GPT
  (``swarmtrain.app.models.stages``), serve it (``peers.swarm.server.StageServer``), and at every
  optimizer step sum the accumulated gradients with the stage's other servers
  (``peers.swarm.replicas.ReplicaSync.sum_grads``) so all of them take the same step; catch up, move
  to the bottleneck stage and leave. The helpers it shares with the rest are here.
* :func:`run_trainer`: feed this trainer's share of the micro-batches through the stage servers
  (``peers.swarm.client.SwarmPipeline``); trainer ``t`` of ``T`` takes the run-wide micro-batches
  ``i * T + t`` (``BatchSampler`` with ``peer_index=t``), so none is fed twice, and closes an
  optimizer step after each ``accumulate`` of its own.
* :func:`train_baseline`: the same stages, micro-batches, steps, optimizer and learning rate in one
  process: each step on the mean gradient of the same ``trainers * accumulate`` micro-batches.

Every role takes the run's ``[swarm]`` settings (``swarmtrain.core.swarm_config.SwarmConfig``).
The optimizer is AdamW at the constant rate ``train.lr`` on both sides, without gradient clipping (a
per-stage clip is not the whole model's clip).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from swarmtrain.app.models import resolve_spec
from swarmtrain.app.models.presets import GPTSpec
from swarmtrain.app.models.stages import GPTStage, build_stages, pipeline_loss
from swarmtrain.core.config import Config
from swarmtrain.core.swarm_config import SwarmConfig

__all__ = [
    "ServerOutcome",
    "TrainerOutcome",
    "run_trainer",
    "final_sync",
    "optimizer_for",
    "stage_limits",
    "tensor_bytes",
    "train_baseline",
    "evaluate_stages",
    "stage_digest",
    "stage_spec",
    "load_stage_state",
]

logger = logging.getLogger(__name__)


@dataclass
class ServerOutcome:
    """What a server reports when it leaves."""

    stage: int
    peer_id: str
    served: int
    refused: int
    version: int
    duplicates: int
    step_failures: int
    syncs_committed: int
    syncs_failed: int
    final_sync: bool
    final_group: int
    digest: str
    ledger: dict[str, Any]
    state: dict[str, tuple[str, tuple[int, ...], bytes]] = field(default_factory=dict)
    #: stage moves: ``src``, ``dst``, ``at`` (left ``src``) and ``serving_at`` (caught up), wall clock
    moves: list[dict[str, Any]] = field(default_factory=list)
    #: it served in step with its stage when it was asked to leave (False: behind or still catching
    #: up, so its parameters are its stage's only if its last average met a replica)
    in_step: bool = True
    #: the device its stage's parameters were on when it left (``str(torch.device)``, e.g. ``cuda:0``)
    device: str | None = None


@dataclass
class TrainerOutcome:
    """What a trainer reports when it is done."""

    index: int
    peer_id: str
    completed: int
    lost: int
    rerouted: int
    reroute_reasons: dict[str, int]
    samples: int
    losses: list[float]
    seconds: float
    ledger: dict[str, Any]
    #: wall-clock time (``time.time()``) each completed micro-batch completed at
    done_at: list[float] = field(default_factory=list)
    #: micro-batches fed again because a dead server took their gradients (``peers.swarm.client``)
    fed_again: int = 0
    #: replies checked on a second replica, and those that disagreed (``peers.swarm.verify``)
    checked: int = 0
    mismatches: int = 0
    #: servers this trainer left out of routing after a check -> why
    excluded: dict[str, str] = field(default_factory=dict)
    #: disagreements no third replica could settle
    disputes: int = 0


def stage_spec(cfg: Config) -> GPTSpec:
    """The GPT architecture of the run (the data decides the vocab)."""
    from swarmtrain.app.data import build_corpus

    corpus = build_corpus(cfg.data)
    return resolve_spec(cfg.model, vocab_size=corpus.vocab_size)


def optimizer_for(module: torch.nn.Module, cfg: Config) -> torch.optim.Optimizer:
    t = cfg.train
    return torch.optim.AdamW(
        module.parameters(), lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay
    )


def stage_digest(module: torch.nn.Module) -> str:
    """SHA-256 of a stage's parameters (names, shapes and bytes, in order)."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def stage_limits(spec: GPTSpec, stage: int, settings: SwarmConfig, cfg: Config) -> Any:
    from peers.swarm.protocol import StageLimits

    return StageLimits(
        stage, settings.stages, spec.n_embd, spec.vocab_size, spec.block_size, cfg.train.batch_size
    )


def _stage_servers(node: Any, stage: int) -> int:
    """Live servers of ``stage`` in the DHT (this one included)."""
    try:
        recs = node.live_peers(timeout=5.0)
    except Exception:  # the count only decides whether to try once more
        return 0
    return sum(1 for r in recs if r.role == "server" and r.extra.get("stage") == stage)


def final_sync(
    node: Any,
    sync: Any,
    first_round: int,
    tries: int = 3,
    weight: float = 1.0,
    deadline: float | None = None,
) -> Any:
    """The leaving servers' last average. A round that formed with fewer members than the stage has
    live servers (one of them was slower to leave than the join window) is tried again, up to
    ``tries`` more rounds: every member of a short round sees the same shortfall, so they all go on
    to the next round and meet there. No further round starts after ``deadline``
    (``time.monotonic()``): a server preempted alone, whose stage's other servers keep serving, finds
    nobody to average with (each round waits up to ``sync.timeout``) and must still leave within its
    grace."""
    final = sync.sync(first_round, weight)
    for extra in range(1, tries + 1):
        if final.committed and len(final.participants) >= _stage_servers(node, sync.stage):
            break
        if deadline is not None and time.monotonic() > deadline:
            logger.info("no time left in the grace for another last average; leaving")
            break
        final = sync.sync(first_round + extra, weight)
    return final


def tensor_bytes(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    t = t.detach().contiguous().cpu()
    return str(t.dtype).removeprefix("torch."), tuple(t.shape), t.numpy().tobytes()


def load_stage_state(module: torch.nn.Module, state: dict[str, tuple[str, tuple[int, ...], bytes]]) -> None:
    """Load what a server reported (``swarmtrain.app.swarm.server``; from this machine's own child
    processes)."""
    import numpy as np

    tensors = {}
    for k, (dtype, shape, data) in state.items():
        arr = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
        tensors[k] = torch.from_numpy(arr.copy())
    module.load_state_dict(tensors)


def run_trainer(
    cfg: Config,
    settings: SwarmConfig,
    index: int,
    on_progress: Callable[[int, float], None] | None = None,
) -> TrainerOutcome:
    """Feed trainer ``index``'s micro-batches through the pipeline; returns its counts.

    A micro-batch that no server of some stage answered for ``give_up_after`` seconds is counted as
    lost and the trainer goes on with the next one.
    """
    from peers.dht.node import PeerNode
    from peers.swarm.client import SwarmPipeline
    from swarmtrain.app.data import BatchSampler, build_corpus

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    corpus = build_corpus(cfg.data)
    spec = resolve_spec(cfg.model, vocab_size=corpus.vocab_size)
    sampler = BatchSampler(
        corpus.train,
        batch_size=cfg.train.batch_size,
        block_size=spec.block_size,
        seed=cfg.train.seed,
        peer_index=index,
        num_peers=settings.trainers,
    )
    with PeerNode(cfg.peers, role="trainer", heartbeat_ttl=6.0) as node:
        pipe = SwarmPipeline(
            node,
            _pipeline_config(cfg, settings, spec),
            seed=cfg.train.seed * 1000 + index,
            # its own copy of a stage settles two replicas' disagreement (``peers.swarm.verify``)
            stage_factory=lambda k: build_stages(spec, settings.stages, seed=cfg.train.seed)[k],
        )
        pipe.wait_for_servers(120.0)
        t0 = time.perf_counter()
        losses, done_at = _feed(pipe, sampler, settings, on_progress)
        st = pipe.tracker.stats
        return TrainerOutcome(
            index=index,
            peer_id=node.peer_id,
            completed=st.completed,
            lost=st.lost,
            rerouted=st.rerouted,
            reroute_reasons=dict(st.reasons),
            samples=st.samples,
            losses=losses,
            seconds=time.perf_counter() - t0,
            ledger=node.ledger.totals(),
            done_at=done_at,
            fed_again=pipe.fed_again,
            checked=pipe.check.checked,
            mismatches=pipe.check.mismatches,
            excluded=dict(pipe.check.convicted),
            disputes=len(pipe.check.disputes),
        )


def _pipeline_config(cfg: Config, settings: SwarmConfig, spec: GPTSpec) -> Any:
    """A trainer's routing settings (``peers.swarm.client.PipelineConfig``)."""
    from peers.swarm.client import PipelineConfig

    if settings.verify_rate and spec.dropout:
        logger.warning("model.dropout %g: replicas' replies differ, no replica check", spec.dropout)
    return PipelineConfig(
        settings.stages,
        spec.n_embd,
        spec.vocab_size,
        spec.block_size,
        cfg.train.batch_size,
        # dropout makes two replicas' replies differ by design: a check would convict honest servers
        verify_rate=settings.verify_rate if spec.dropout == 0 else 0.0,
    )


def _feed(
    pipe: Any,
    sampler: Any,
    settings: SwarmConfig,
    on_progress: Callable[[int, float], None] | None,
) -> tuple[list[float], list[float]]:
    """Feed the trainer's micro-batches through ``pipe``, closing a step after each ``accumulate``;
    returns the losses and the wall-clock times of the completed ones. A micro-batch no server
    answered is lost: logged, and the trainer goes on."""
    from peers.swarm.client import NoServer

    losses: list[float] = []
    done_at: list[float] = []
    n, per_step = settings.microbatches, settings.accumulate
    completed = 0  # of this step's micro-batches
    for i in range(n):
        x, y = sampler.get(i)
        try:
            losses.append(pipe.train_microbatch(sampler.global_index(i), x, y))
            done_at.append(time.time())
            completed += 1
        except NoServer as e:
            logger.warning("micro-batch %d lost: %s", sampler.global_index(i), e)
        if (i + 1) % per_step == 0 or i == n - 1:  # every server takes the step before the next
            pipe.close_step(i // per_step, completed)
            completed = 0
        if on_progress is not None and losses:
            on_progress(i + 1, losses[-1])
    return losses, done_at


@torch.no_grad()
def evaluate_stages(stages: list[GPTStage], cfg: Config) -> float:
    """Mean validation loss of the composed stages on the run's fixed validation batches."""
    from swarmtrain.app.data import build_corpus, eval_batches

    corpus = build_corpus(cfg.data)
    batches = eval_batches(
        corpus.val,
        n_batches=cfg.train.eval_batches,
        batch_size=cfg.train.batch_size,
        block_size=stages[0].spec.block_size,
    )
    for s in stages:
        s.eval()
    total = sum(float(pipeline_loss(stages, x, y)) for x, y in batches)
    return total / len(batches)


def train_baseline(cfg: Config, settings: SwarmConfig) -> tuple[float, list[GPTStage]]:
    """The same stages trained in one process as the swarm trains them: step ``k`` on the mean
    gradient of the micro-batches ``accumulate * k .. accumulate * (k + 1) - 1`` of every trainer (the
    last step may be shorter); returns the final validation loss and the stages."""
    from swarmtrain.app.data import BatchSampler, build_corpus

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    corpus = build_corpus(cfg.data)
    spec = resolve_spec(cfg.model, vocab_size=corpus.vocab_size)
    stages = build_stages(spec, settings.stages, seed=cfg.train.seed)
    opts = [optimizer_for(s, cfg) for s in stages]
    samplers = [
        BatchSampler(
            corpus.train,
            batch_size=cfg.train.batch_size,
            block_size=spec.block_size,
            seed=cfg.train.seed,
            peer_index=t,
            num_peers=settings.trainers,
        )
        for t in range(settings.trainers)
    ]
    n, per_step = settings.microbatches, settings.accumulate
    for first in range(0, n, per_step):
        mbs = [(s, i) for i in range(first, min(first + per_step, n)) for s in samplers]
        for sampler, i in mbs:
            x, y = sampler.get(i)
            (pipeline_loss(stages, x, y) / len(mbs)).backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
    return evaluate_stages(stages, cfg), stages
