"""The local training loop every peer runs, with a ``Strategy`` hook after each backward pass.

One step: set the learning rate (warmup + cosine), run ``grad_accum`` micro-batches forward and
backward (bf16 autocast on CUDA), clip the gradient norm, call ``strategy.step(tokens)`` (which
steps the inner optimizer and talks to peers), zero the gradients. Evaluation on a fixed held-out
set, JSONL metrics, a progress bar, and checkpoints that resume bit-exactly (model, optimizer,
strategy, data position and RNG states) are around it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

import optimizers  # noqa: F401  (registers every strategy)
from optimizers.base import StrategyContext, build_strategy
from swarmtrain.app.data import BatchSampler, build_corpus, eval_batches
from swarmtrain.app.models import GPT, build_model
from swarmtrain.app.train import trainer_state
from swarmtrain.app.train.inner_optim import build_optimizer
from swarmtrain.app.train.lr import lr_at
from swarmtrain.app.train.metrics import MetricsWriter
from swarmtrain.app.train.progress import TrainProgress
from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import Collective, Reducer, StepReport

__all__ = ["Trainer", "StepInfo", "TrainResult", "resolve_device", "build_optimizer"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepInfo:
    """What happened on one training step (passed to ``fit``'s ``on_step`` callback).

    ``loss`` and ``grad_norm`` are read from the device lazily, so a callback that ignores them costs
    no GPU synchronisation.
    """

    step: int  # steps done, counting this one
    tokens: int  # tokens this peer has trained on so far
    lr: float
    elapsed_s: float  # wall time of this fit() call so far
    tokens_per_s: float  # this fit() call's training throughput so far (evaluation and saving excluded)
    report: StepReport
    loss_tensor: torch.Tensor
    grad_norm_tensor: torch.Tensor | None = None
    val_loss: float | None = None

    @property
    def loss(self) -> float:
        """Mean training loss of this step's micro-batches."""
        return float(self.loss_tensor.item())

    @property
    def grad_norm(self) -> float | None:
        """Gradient norm before clipping (``None`` when clipping is off)."""
        return None if self.grad_norm_tensor is None else float(self.grad_norm_tensor.item())


@dataclass
class TrainResult:
    """Summary of one ``fit`` call."""

    steps: int  # total steps done (including those before a resume)
    tokens: int
    final_train_loss: float
    final_val_loss: float | None
    wall_s: float  # wall time of this fit() call (mid-run evals and checkpoints in, the final eval out)
    history: list[dict[str, Any]] = field(default_factory=list)  # the train/eval records logged
    metrics_path: str | None = None
    checkpoint_dir: str | None = None
    bytes_sent: int = 0
    bytes_received: int = 0
    train_s: float = 0.0  # wall_s without evaluation and checkpoint saving


@dataclass
class _FitRun:
    """The running figures of one ``fit`` call, shared by its step helpers."""

    t0: float  # perf_counter at the start of the call
    tokens0: int  # tokens trained on before the call
    end: int  # the step the call stops at
    paused: float = 0.0  # evaluation and checkpoint time, left out of tokens/s
    last_loss: torch.Tensor = field(default_factory=lambda: torch.full((), math.nan))
    window: list[torch.Tensor] = field(default_factory=list)  # step losses since the last train record
    val_loss: float | None = None
    val_step: int = -1  # the step of the last evaluation
    history: list[dict[str, Any]] = field(default_factory=list)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; anything else must be a device torch knows.

    Raises:
        ConfigError: an unknown device or CUDA requested without one.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"train.device: unknown device {name!r} (use auto, cpu, cuda or cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device: {name!r} requested but CUDA is not available")
    if dev.type not in ("cpu", "cuda", torch._C._get_privateuse1_backend_name()):
        raise ConfigError(f"train.device: {name!r} is not supported (use auto, cpu, cuda or cuda:N)")
    return dev


def _autocast_dtype(device: torch.device, bf16: str) -> torch.dtype | None:
    """bf16 autocast on CUDA when supported (``auto`` or ``on``), on CPU only when asked (``on``)."""
    if device.type == "cuda" and bf16 in ("auto", "on") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if device.type == "cpu" and bf16 == "on":
        return torch.bfloat16
    return None


class Trainer:
    """Trains one peer's replica of the model.

    Args:
        config: the run configuration.
        collective: group communication for networked strategies (``None``: single peer).
        peer_index: this peer's index among ``num_peers`` (selects its disjoint data shard).
        num_peers: peers training together.
        reducer: robust reducer handed to the strategy (``None``: token-weighted mean).
        data_seed: seed of this peer's data stream (default ``config.train.seed``). Volunteers who do
            not know their index derive it from their peer ID, so their streams differ. It is also
            the run's codec seed: a random-draw codec (ternary) is seeded
            ``compression.peer_seed(data seed, peer_index)`` unless ``compression.options.seed`` is
            set (then that replaces the data seed), so every peer draws differently.

    Attributes:
        model: the (uncompiled) ``GPT``.
        optimizer: the inner optimizer.
        strategy: the distributed algorithm built from ``config.strategy``.
        step: steps done so far.
        tokens: tokens trained on so far.
    """

    def __init__(
        self,
        config: Config,
        *,
        collective: Collective | None = None,
        peer_index: int = 0,
        num_peers: int = 1,
        reducer: Reducer | None = None,
        data_seed: int | None = None,
    ) -> None:
        tc = config.train
        if num_peers < 1 or not 0 <= peer_index < num_peers:
            raise ConfigError(f"peer_index {peer_index} is outside [0, num_peers={num_peers})")
        self.config = config
        self.peer_index = peer_index
        self.num_peers = num_peers
        self.device = resolve_device(tc.device)
        if tc.threads is not None:  # several peers on one machine: one thread each avoids oversubscription
            torch.set_num_threads(tc.threads)
        torch.manual_seed(tc.seed * 1_000_003 + peer_index)  # dropout streams differ per peer

        self._build_model_and_data(data_seed)
        self.optimizer = build_optimizer(self.model, config, self.device)
        self.strategy = build_strategy(
            StrategyContext(
                model=self.model,
                optimizer=self.optimizer,
                config=config.strategy,
                compression=config.compression,
                collective=collective,
                reducer=reducer,
                # each peer its own codec draws (a volunteer without a rank: its data seed differs)
                codec_seed=tc.seed if data_seed is None else data_seed,
                codec_peer=peer_index,
            )
        )
        self._forward: Callable[..., tuple[torch.Tensor, torch.Tensor | None]] = self.model
        if tc.compile:
            self._forward = torch.compile(self.model)  # type: ignore[assignment]
        self._amp_dtype = _autocast_dtype(self.device, tc.bf16)
        self.step = 0
        self.tokens = 0
        self.wall_s = 0.0  # training wall time of earlier fit() calls and runs resumed from
        self._fit_elapsed = 0.0  # wall time of the running fit() call at its last checkpoint
        self.bytes_sent = 0
        self.bytes_received = 0
        self.tokens_per_step = tc.batch_size * tc.grad_accum * self.model.block_size
        suffix = "" if num_peers == 1 else f".peer{peer_index}"
        self.out_dir = Path(tc.out_dir)
        self.metrics_path = self.out_dir / f"metrics{suffix}.jsonl"
        self.checkpoint_dir = self.out_dir / f"checkpoint{suffix}"
        logger.info(
            "model %s: %.2fM params on %s; corpus %s: %d train / %d val tokens",
            config.model.preset,
            self.model.num_params() / 1e6,
            self.device,
            self.corpus.name,
            len(self.corpus.train),
            len(self.corpus.val),
        )

    def _build_model_and_data(self, data_seed: int | None) -> None:
        """The corpus, the model on its device, this peer's batch stream and the fixed held-out batches."""
        config, tc = self.config, self.config.train
        self.corpus = build_corpus(config.data, vocab_size=config.model.vocab_size)
        data_vocab = self.corpus.vocab_size if config.data.source == "bin" else None
        self.model: GPT = build_model(config.model, seed=tc.seed, vocab_size=data_vocab).to(self.device)
        self.sampler = BatchSampler(
            self.corpus.train,
            batch_size=tc.batch_size,
            block_size=self.model.block_size,
            seed=tc.seed if data_seed is None else data_seed,
            peer_index=self.peer_index,
            num_peers=self.num_peers,
            grad_accum=tc.grad_accum,
            vocab_size=self.model.vocab_size if data_vocab is not None else None,
        )
        self._val = eval_batches(
            self.corpus.val,
            n_batches=tc.eval_batches,
            batch_size=tc.batch_size,
            block_size=self.model.block_size,
        )

    # ----------------------------------------------------------------------------------- steps
    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self._amp_dtype)

    def _to_device(self, x: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cpu":
            return x
        return x.to(self.device, non_blocking=True)

    def train_step(self) -> tuple[torch.Tensor, torch.Tensor | None, StepReport, float]:
        """One optimisation step.

        Returns:
            ``(mean loss, grad norm or None, strategy report, lr)``; the tensors stay on the device.
        """
        tc = self.config.train
        lr = lr_at(self.step, tc)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(tc.grad_accum):
            x, y = self.sampler.get(self.step, micro)
            x, y = self._to_device(x), self._to_device(y)
            with self._autocast():
                _, loss = self._forward(x, y)
            if loss is None:  # pragma: no cover - GPT always returns a loss with targets
                raise ConfigError("the model returned no loss")
            (loss / tc.grad_accum).backward()
            loss_sum += loss.detach()
        grad_norm = None
        if tc.grad_clip is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.grad_clip)
        report = self.strategy.step(self.tokens_per_step)
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += self.tokens_per_step
        self.bytes_sent += report.bytes_sent
        self.bytes_received += report.bytes_received
        return loss_sum / tc.grad_accum, grad_norm, report, lr

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed validation batches (the same bytes on every peer)."""
        was_training = self.model.training
        self.model.eval()
        total = torch.zeros((), device=self.device)
        for x, y in self._val:
            with self._autocast():
                _, loss = self._forward(self._to_device(x), self._to_device(y))
            if loss is not None:
                total += loss.float()
        self.model.train(was_training)
        return float((total / len(self._val)).item())

    # ------------------------------------------------------------------------------------- fit
    def fit(
        self, on_step: Callable[[StepInfo], None] | None = None, *, max_steps: int | None = None
    ) -> TrainResult:
        """Train until ``config.train.steps`` steps are done, ``max_time`` runs out, or ``max_steps`` more.

        Args:
            on_step: called after every step with its ``StepInfo``.
            max_steps: stop after this many steps of this call (the LR schedule still spans
                ``config.train.steps``; used to split a run, e.g. before a checkpoint).

        Returns:
            The run's summary; the final validation loss is measured after the last step.
        """
        tc = self.config.train
        end = tc.steps if max_steps is None else min(tc.steps, self.step + max_steps)
        deadline = None if tc.max_time is None else time.monotonic() + tc.max_time
        run = _FitRun(t0=time.perf_counter(), tokens0=self.tokens, end=end)
        self.model.train()
        with (
            MetricsWriter(self.out_dir, filename=self.metrics_path.name) as metrics,
            TrainProgress(tc.steps, self.step, enabled=tc.progress) as bar,
        ):
            while self.step < end and (deadline is None or time.monotonic() < deadline):
                run.last_loss, grad_norm, report, lr = self.train_step()
                run.window.append(run.last_loss)
                elapsed = time.perf_counter() - run.t0
                tps = (self.tokens - run.tokens0) / max(elapsed - run.paused, 1e-9)
                if report.synced:
                    metrics.write(self._sync_record(report))
                step_val = self._step_records(run, metrics, bar, grad_norm, lr, tps, elapsed)
                if on_step is not None:
                    info = StepInfo(
                        self.step, self.tokens, lr, elapsed, tps, report, run.last_loss, grad_norm
                    )
                    on_step(info if step_val is None else replace(info, val_loss=step_val))
            wall = time.perf_counter() - run.t0
            self._finish_records(run, metrics, wall)
        self.wall_s += wall
        self._fit_elapsed = 0.0
        return TrainResult(
            steps=self.step,
            tokens=self.tokens,
            final_train_loss=float(run.last_loss.item()),
            final_val_loss=run.val_loss,
            wall_s=wall,
            history=run.history,
            metrics_path=str(self.metrics_path),
            checkpoint_dir=str(self.checkpoint_dir) if tc.checkpoint_interval else None,
            bytes_sent=self.bytes_sent,
            bytes_received=self.bytes_received,
            train_s=wall - run.paused,
        )

    def _step_records(
        self,
        run: _FitRun,
        metrics: MetricsWriter,
        bar: TrainProgress,
        grad_norm: torch.Tensor | None,
        lr: float,
        tps: float,
        elapsed: float,
    ) -> float | None:
        """After a step: the due evaluation, train record, progress bar and checkpoint. Evaluation and
        checkpoint time go to ``run.paused``, out of tokens/s. Returns this step's val loss, if any."""
        tc = self.config.train
        step_val: float | None = None
        if self.step % tc.eval_interval == 0 and self.step < run.end:
            t_pause = time.perf_counter()
            step_val = run.val_loss = self._logged_eval(metrics, run.history)
            run.val_step = self.step
            run.paused += time.perf_counter() - t_pause
        if self.step % tc.log_interval == 0 or self.step == run.end:
            rec = self._train_record(run.window, grad_norm, lr, tps, elapsed)
            run.window = []
            metrics.write(rec)
            metrics.flush()
            run.history.append(rec)
            bar.update(self.step, float(rec["loss"]), tps)
            logger.info("step %d loss %.4f lr %.2e %.0f tok/s", self.step, rec["loss"], lr, tps)
        else:
            bar.update(self.step)
        if tc.checkpoint_interval and self.step % tc.checkpoint_interval == 0:
            t_pause = time.perf_counter()
            self._fit_elapsed = t_pause - run.t0
            self.save_checkpoint(self.checkpoint_dir)
            run.paused += time.perf_counter() - t_pause
        return step_val

    def _finish_records(self, run: _FitRun, metrics: MetricsWriter, wall: float) -> None:
        """At the end of ``fit``: a train record for steps not logged yet, and the final evaluation
        unless the last step already had one."""
        if run.window:
            tps = (self.tokens - run.tokens0) / max(wall - run.paused, 1e-9)
            lr = lr_at(max(self.step - 1, 0), self.config.train)
            rec = self._train_record(run.window, None, lr, tps, wall)
            metrics.write(rec)
            run.history.append(rec)
        if run.val_step != self.step:
            run.val_loss = self._logged_eval(metrics, run.history)

    def _logged_eval(self, metrics: MetricsWriter, history: list[dict[str, Any]]) -> float:
        val_loss = self.evaluate()
        rec: dict[str, Any] = {"kind": "eval", "step": self.step, "tokens": self.tokens, "val_loss": val_loss}
        metrics.write(rec)
        history.append(rec)
        logger.info("step %d val loss %.4f", self.step, val_loss)
        return val_loss

    def _train_record(
        self,
        window: list[torch.Tensor],
        grad_norm: torch.Tensor | None,
        lr: float,
        tps: float,
        elapsed: float,
    ) -> dict[str, Any]:
        losses = torch.stack(window).float().cpu()
        rec: dict[str, Any] = {
            "kind": "train",
            "step": self.step,
            "tokens": self.tokens,
            "loss": float(losses[-1]),
            "loss_mean": float(losses.mean()),
            "lr": lr,
            "tokens_per_s": tps,
            "elapsed_s": elapsed,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
        }
        if grad_norm is not None:
            rec["grad_norm"] = float(grad_norm.item())
        return rec

    def _sync_record(self, r: StepReport) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "kind": "sync",
            "step": self.step,
            "round_id": r.round_id,
            "committed": r.committed,
            "participants": r.participants,
            "round_bytes_sent": r.bytes_sent,
            "round_bytes_received": r.bytes_received,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
        }
        rec.update({f"x_{k}": float(v) for k, v in r.extra.items()})
        return rec

    # ----------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, directory: str | Path) -> Path:
        """Write model, optimizer, strategy, data position, RNG states and counters to ``directory``."""
        return trainer_state.save_checkpoint(self, directory)

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore everything :meth:`save_checkpoint` wrote; the next step continues bit-exactly.

        Raises:
            CheckpointError: unreadable checkpoint, or one whose tensors do not fit this model.
        """
        trainer_state.load_checkpoint(self, directory)

    def load_peer_state(
        self,
        parameters: Mapping[str, torch.Tensor],
        strategy_state: Any,
        step: int,
        optimizer_state: Any = None,
    ) -> None:
        """Adopt another peer's parameters, strategy state, step count and (when given) inner optimizer
        state (see :func:`swarmtrain.app.train.trainer_state.load_peer_state`).

        Raises:
            CheckpointError: the state does not fit this trainer; nothing changed then.
        """
        trainer_state.load_peer_state(self, parameters, strategy_state, step, optimizer_state)

    def close(self) -> None:
        """Release the strategy (and its network resources)."""
        self.strategy.close()
