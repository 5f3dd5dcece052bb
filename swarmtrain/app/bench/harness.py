"""The in-process strategy harness: N workers of one strategy in one process, no network.

Each worker is a real ``Trainer`` (the same model, data shard, inner optimizer, strategy and codec
code as a real peer, built from the same ``Config``), driven by its own thread and talking to the
others through ``optimizers.InProcessGroup`` instead of libp2p. What differs from real peers is only
the transport: no DHT, no late peers, no framing, and bytes are codec payload bytes (a real peer's
ledger adds framing and the butterfly's share). That makes a 4-worker, 300-step comparison a matter
of a minute or two, so strategies and settings can be swept (``swarmtrain bench strategies``) and
the chosen points re-run over real peers to check that both paths agree.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError

__all__ = ["CurvePoint", "HarnessResult", "global_loss", "run_in_process"]


@dataclass(frozen=True)
class CurvePoint:
    """The run after one sync: local steps done, tokens all workers trained on, codec payload bytes
    one worker had sent by then, and the validation loss of the synced model (worker 0's)."""

    step: int
    tokens: int
    bytes: int
    val_loss: float


@dataclass(frozen=True)
class HarnessResult:
    """One in-process run: the same measures ``simulate`` reports for real peers.

    Attributes:
        workers: workers that trained together.
        steps: local steps per worker.
        tokens: tokens trained on, all workers together.
        final_val_loss: the final validation loss of the run's model: mean over workers, or for
            Streaming DiLoCo its global (anchor) model's, which every worker holds the same.
        val_losses: each worker's final validation loss (of its own, local model).
        bytes_sent_per_peer: codec payload bytes one worker sent (mean over workers).
        peak_sync_bytes: the most bytes one worker sent in a single sync.
        rounds_committed / rounds_failed: per worker, the mean.
        params_identical: all workers ended with bit-identical shared parameters.
        wall_s: wall time of the training, all workers at once.
        curve: the run after each recorded sync and at the end (``curve_points`` > 0), else empty.
        local_val_loss: Streaming DiLoCo: the mean over workers of their local (mixed) models'
            final loss, what a peer's own evaluation reports; ``None`` for the other strategies.
    """

    workers: int
    steps: int
    tokens: int
    final_val_loss: float
    val_losses: tuple[float, ...]
    bytes_sent_per_peer: float
    peak_sync_bytes: int
    rounds_committed: float
    rounds_failed: float
    params_identical: bool
    wall_s: float
    curve: tuple[CurvePoint, ...] = ()
    local_val_loss: float | None = None

    @property
    def bytes_per_token(self) -> float:
        """Bytes one worker sent per token it trained on."""
        return self.bytes_sent_per_peer / max(self.tokens / self.workers, 1)


@dataclass
class _Tally:
    committed: int = 0
    failed: int = 0
    peak: int = 0
    val_loss: float = float("nan")
    errors: list[BaseException] = field(default_factory=list)


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """One torch thread per worker thread: the workers are the parallelism (as peers on one machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _quiet(cfg: Config, out_dir: str) -> Config:
    """``cfg`` without the progress bar, with metrics in a scratch folder."""
    train = cfg.train.model_copy(update={"progress": False, "out_dir": out_dir, "checkpoint_interval": 0})
    return cfg.model_copy(update={"train": train})


def global_loss(trainer: Any) -> float:
    """The validation loss of the run's global model as ``trainer`` holds it: Streaming DiLoCo's
    workers train a mix of their local steps and the anchor, so the anchor (its ``global_parameters``,
    the same on every worker) is loaded for the evaluation and the local model put back after; every
    other strategy's model is the global one after a sync."""
    if trainer.config.strategy.name != "streaming_diloco":
        return float(trainer.evaluate())
    params = dict(trainer.model.named_parameters())
    local = {n: p.detach().clone() for n, p in params.items()}
    try:
        with torch.no_grad():
            for n, t in trainer.strategy.global_parameters().items():
                params[n].copy_(t.to(device=params[n].device, dtype=params[n].dtype))
        return float(trainer.evaluate())
    finally:
        with torch.no_grad():
            for n, t in local.items():
                params[n].copy_(t)


def _identical(trainers: list[Any]) -> bool:
    """The parameters the workers must agree on (all of them; Streaming DiLoCo's global copy) are
    bit-identical, by the digest real peers compare."""
    from swarmtrain.app.peer.state import shared_digest

    return len({shared_digest(t) for t in trainers}) == 1


@dataclass
class _Curve:
    """Worker 0's curve: after a committed sync at least ``every`` steps past the last point and
    before the last step (whose loss ``fit`` measures anyway), the synced model's validation loss."""

    every: int
    end: int
    workers: int
    last: int = 0
    points: list[CurvePoint] = field(default_factory=list)

    def after_step(self, trainer: Any, info: Any) -> None:
        report = info.report
        due = info.step < self.end and info.step - self.last >= self.every
        if report.synced and report.committed and due:
            self.last = info.step
            val = global_loss(trainer)
            self.points.append(CurvePoint(info.step, info.tokens * self.workers, trainer.bytes_sent, val))


def _train(trainer: Any, tally: _Tally, curve: _Curve | None = None) -> None:
    """One worker's thread: train to the end, counting its syncs (and recording ``curve``); an
    exception is kept for the caller."""

    def on_step(info: Any) -> None:
        report = info.report
        if report.synced:
            tally.peak = max(tally.peak, report.bytes_sent)
            if report.committed:
                tally.committed += 1
            else:
                tally.failed += 1
        if curve is not None:
            curve.after_step(trainer, info)

    try:
        val = trainer.fit(on_step).final_val_loss
        tally.val_loss = float("nan") if val is None else val
    except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
        tally.errors.append(e)


def _run_threads(
    trainers: list[Any], tallies: list[_Tally], timeout: float, curve: _Curve | None = None
) -> float:
    """Train every worker in its own thread (worker 0 records ``curve``); the wall time. Raises a
    worker's error or a hang."""
    t0 = time.perf_counter()
    threads = [
        threading.Thread(target=_train, args=(t, tally, curve if i == 0 else None), daemon=True)
        for i, (t, tally) in enumerate(zip(trainers, tallies, strict=True))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(timeout - (time.perf_counter() - t0), 1.0))
        if t.is_alive():
            raise RuntimeError(f"the in-process run hung for more than {timeout:.0f} s")
    for tally in tallies:
        if tally.errors:
            raise RuntimeError(f"a worker failed: {tally.errors[0]}") from tally.errors[0]
    return time.perf_counter() - t0


def _summarise(
    cfg: Config, trainers: list[Any], tallies: list[_Tally], wall: float, curve: _Curve | None
) -> HarnessResult:
    n = len(trainers)
    val_losses = tuple(t.val_loss for t in tallies)
    final, local = sum(val_losses) / n, None
    if cfg.strategy.name == "streaming_diloco":
        final, local = global_loss(trainers[0]), final
    points: tuple[CurvePoint, ...] = ()
    if curve is not None:  # the end: every worker's final loss and bytes, as the result reports them
        end = CurvePoint(
            trainers[0].step,
            sum(t.tokens for t in trainers),
            round(sum(t.bytes_sent for t in trainers) / n),
            final,
        )
        points = (*curve.points, end)
    return HarnessResult(
        workers=n,
        steps=cfg.train.steps,
        tokens=sum(t.tokens for t in trainers),
        final_val_loss=final,
        val_losses=val_losses,
        bytes_sent_per_peer=sum(t.bytes_sent for t in trainers) / n,
        peak_sync_bytes=max(t.peak for t in tallies),
        rounds_committed=sum(t.committed for t in tallies) / n,
        rounds_failed=sum(t.failed for t in tallies) / n,
        params_identical=_identical(trainers),
        wall_s=wall,
        curve=points,
        local_val_loss=local,
    )


def run_in_process(
    cfg: Config,
    workers: int,
    *,
    timeout: float = 1800.0,
    data_seed: int | None = None,
    curve_points: int = 0,
    wrap: Callable[[int, Any], Any] | None = None,
) -> HarnessResult:
    """Train ``workers`` replicas of ``cfg``'s run in this process, each on its own data shard.

    Args:
        cfg: the run's configuration (strategy, codec, reducer, model, data, steps), as a peer's.
        workers: how many workers train together (>= 1).
        timeout: hang guard for one collective operation and for the whole run, in seconds.
        data_seed: seed of the data order (default ``cfg.train.seed``); the model's initialisation
            stays ``cfg.train.seed``'s.
        curve_points: record the validation loss after committed syncs, at most this many before
            the end (every sync when syncs are at least ``steps / curve_points`` steps apart; else
            the first sync each that many steps); 0: only the end, no curve.
        wrap: ``wrap(i, member)`` is worker i's collective instead of the group's ``member`` (e.g. a
            recorder of what it reduces, ``swarmtrain.app.bench.pseudo``).

    Raises:
        ConfigError: ``workers`` < 1.
        RuntimeError: a worker raised (re-raised with its message) or the run hung.
    """
    from optimizers import InProcessGroup
    from peers.reducers import build_reducer
    from swarmtrain.app.train.trainer import Trainer

    if workers < 1:
        raise ConfigError(f"the harness needs at least one worker, got {workers}")
    group = InProcessGroup(workers, timeout=timeout)
    tallies = [_Tally() for _ in range(workers)]
    with tempfile.TemporaryDirectory(prefix="swarmtrain-harness-") as scratch, _torch_threads(1):
        run_cfg = _quiet(cfg, scratch)
        # built one after another: model init and the per-peer seeds use torch's global generator
        trainers = [
            Trainer(
                run_cfg,
                collective=group[i] if wrap is None else wrap(i, group[i]),
                peer_index=i,
                num_peers=workers,
                data_seed=data_seed,
                reducer=build_reducer(cfg.peers.reducer, cfg.peers.byzantine_f, **cfg.peers.reducer_options),
            )
            for i in range(workers)
        ]
        steps = cfg.train.steps
        curve = _Curve(-(-steps // curve_points), steps, workers) if curve_points > 0 else None
        try:
            wall = _run_threads(trainers, tallies, timeout, curve)
            result = _summarise(cfg, trainers, tallies, wall, curve)
        finally:
            for trainer in trainers:
                trainer.close()
    return result
