"""``StreamingDiLoCo``: DiLoCo that syncs one fragment at a time, overlapping the sync with training.

Douillard et al. 2025, "Streaming DiLoCo with overlapping communication: towards a distributed free
lunch". The model is split into ``F`` strided fragments (``optimizers.fragments``). Fragment ``f``
syncs after the inner steps where ``step % H == offset_f``:

    t:      delta_f = anchor_f - local_f(t)      (snapshot; its all-reduce starts in a background thread)
    t+tau:  avg     = the all-reduce's result   (the thread is joined: training overlapped the transfer)
            anchor_f = OuterSGD(anchor_f, avg)
            local_f  = alpha * local_f(t+tau) + (1 - alpha) * anchor_f

``alpha`` (``strategy.mixing``) weighs the *local* parameters, as in the paper: ``alpha = 0`` replaces
them by the new global ones (plain DiLoCo per fragment). ``tau`` is ``strategy.overlap``; ``tau = 0``
syncs in the calling thread. At most one fragment is ever in flight (checked when built), and no
fragment holds more than ``ceil(total / F)`` elements (``optimizers.fragments`` cuts tensors into flat
pieces where whole ones do not balance), so the peak bytes of a sync are ``1/F`` of a DiLoCo sync.
The anchor and outer momentum are kept per piece (a piece is a whole parameter unless it had to be
cut); ``state_dict()["anchor"]`` and ``global_parameters()`` are per parameter. What is exchanged
goes through the configured codec; error-feedback residuals live in the codec, keyed by what they
compress, never by position: the in-process collective keys them by piece key, the peers' butterfly
(``peers.rounds.butterfly``) by the fragment's pieces (names and shapes) and element range, so two
fragments never share memory, even of equal size. Every sync's ``StepReport.extra["fragment"]``
says which fragment the round was (the peer loop counts outcomes per fragment from it).

A round that does not commit leaves the fragment untouched (its error-feedback residuals included:
``reduce_or_rollback``): it keeps training locally and retries at its next slot, with a
pseudo-gradient (and token weight) covering all steps since its last good sync.
``state_dict()`` joins an in-flight round and stores its outcome, so a checkpoint or a newcomer's
download applies that result at the same step as every other peer.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from optimizers.base import (
    STRATEGIES,
    AnchoredStrategy,
    StrategyContext,
    compressor_state,
    load_compressor_state,
    make_compressor,
    options_of,
    reduce_or_rollback,
    require_collective,
    round_report,
    trainable_parameters,
)
from optimizers.fragments import fragment_offsets, piece_range, split_fragments
from optimizers.outer_store import OuterStore
from swarmtrain.core.config import StreamingDiLoCoConfig
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import PeriodicStrategy, RoundResult, StepReport

__all__ = ["StreamingDiLoCo"]


@dataclass
class _Pending:
    fragment: int
    apply_at: int
    future: cf.Future[RoundResult] | None = None
    result: RoundResult | None = None

    def wait(self) -> RoundResult:
        if self.result is None:
            if self.future is None:  # pragma: no cover - constructed with one of them
                raise ConfigError("pending sync has neither a future nor a result")
            self.result = self.future.result()
            self.future = None
        return self.result


@STRATEGIES.register("streaming_diloco")
class StreamingDiLoCo(AnchoredStrategy, PeriodicStrategy):
    """Streaming DiLoCo (fragments, overlap tau, mixing alpha) over any codec.

    Options come from ``ctx.config``, a ``StreamingDiLoCoConfig``: ``inner_steps`` (H),
    ``fragments`` (F), ``overlap`` (tau), ``mixing`` (alpha), ``outer_lr``, ``outer_momentum``,
    ``nesterov``, ``sync_timeout``, ``outer_state`` (where the anchor and outer momentum live:
    ``optimizers.outer_store``). The config already holds F <= H and an overlap that leaves at
    most one fragment in flight; only the model can say whether it has F blocks to split.

    Raises:
        ConfigError: without a collective, with another strategy's options, or with more fragments
            than the model has blocks.
    """

    name = "streaming_diloco"

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx
        self.config = cfg = options_of(ctx, StreamingDiLoCoConfig)
        self.collective = require_collective(ctx, self.name)
        self.inner_steps = cfg.inner_steps
        self.overlap = cfg.overlap
        self.mixing = float(cfg.mixing)
        self.offsets = fragment_offsets(cfg.inner_steps, cfg.fragments, cfg.overlap)
        self.fragments = split_fragments(ctx.model, cfg.fragments)
        self.compressor = make_compressor(ctx)
        self.params = trainable_parameters(ctx.model)
        numels = {n: p.numel() for n, p in self.params.items()}
        # piece key -> (parameter, lo, hi): flat element ranges, whole parameters where possible
        self.pieces = {k: piece_range(k, numels) for frag in self.fragments for k in frag}
        for k, (n, _, _) in self.pieces.items():
            if k != n and not self.params[n].is_contiguous():  # pragma: no cover - params are contiguous
                raise ConfigError(f"parameter {n!r} must be contiguous to be cut into fragments")
        # fp32 master copy: outer updates must not be rounded away in bf16/fp16 models
        self.store = OuterStore({k: self._view(k) for k in self.pieces}, cfg)
        self.anchor = self.store.anchor  # per piece; the same dict for the store's life
        self.steps = 0
        self.outer_steps = [0] * len(self.fragments)
        self.failed_rounds = 0
        self.tokens_since_sync = [0] * len(self.fragments)
        self.pending: _Pending | None = None
        self._pool: cf.ThreadPoolExecutor | None = None
        self._wait_s = 0.0  # seconds this step() blocked on communication

    def _view(self, key: str) -> torch.Tensor:
        """The piece ``key`` of the model: its parameter, or a flat view of a range of it (writable)."""
        name, lo, hi = self.pieces[key]
        p = self.params[name]
        return p if key == name else p.detach().view(-1)[lo:hi]

    def _whole(self, pieces: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-parameter tensors assembled from per-piece ones (each piece's own device and dtype)."""
        out: dict[str, torch.Tensor] = {}
        for key, (name, lo, hi) in self.pieces.items():
            t = pieces[key]
            if key == name:
                out[name] = t.clone()
                continue
            if name not in out:
                out[name] = t.new_empty(self.params[name].shape)
            out[name].view(-1)[lo:hi] = t.reshape(-1)
        return {n: out[n] for n in self.params}

    def global_parameters(self) -> dict[str, torch.Tensor]:
        """Copies of the global (anchor) parameters per parameter name, fp32 (see the base class)."""
        return self._whole(self.anchor)

    def _due(self) -> int | None:
        phase = self.steps % self.inner_steps
        for f, off in enumerate(self.offsets):
            if off == phase:
                return f
        return None

    @torch.no_grad()
    def step(self, tokens: int) -> StepReport:
        """One inner step; apply a sync that is due, then start the next fragment's sync if scheduled.

        ``extra["comm_wait_s"]``: seconds this call blocked on communication: waiting to join the
        in-flight round (near zero when ``tau`` steps of training hid the transfer) plus, with
        ``tau = 0``, the whole synchronous all-reduce.
        """
        self._wait_s = 0.0
        self.ctx.optimizer.step()
        self.steps += 1
        self.tokens_since_sync = [t + int(tokens) for t in self.tokens_since_sync]
        report = StepReport(extra={"comm_wait_s": 0.0})
        if self.pending is not None and self.pending.apply_at <= self.steps:
            report = self._apply(self.pending)
        f = self._due()
        if f is not None:
            if self.pending is not None:  # pragma: no cover - excluded by fragment_offsets
                raise ConfigError("two fragments in flight; overlap is too long for the schedule")
            self.pending = self._start(f)
            if self.overlap == 0:
                report = self._apply(self.pending)
        if report.synced:
            report = replace(report, extra={**report.extra, "comm_wait_s": self._wait_s})
        return report

    def _start(self, f: int) -> _Pending:
        keys = self.fragments[f]
        pseudo = {k: self.store.anchor_on_device(k) - self._view(k).detach().to(torch.float32) for k in keys}
        weight = float(self.tokens_since_sync[f])
        pending = _Pending(fragment=f, apply_at=self.steps + self.overlap)
        if self.overlap == 0:
            t0 = time.perf_counter()
            pending.result = self._reduce(pseudo, weight)
            self._wait_s += time.perf_counter() - t0
        else:
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="streaming-diloco")
            pending.future = self._pool.submit(self._reduce, pseudo, weight)
        return pending

    def _reduce(self, pseudo: dict[str, torch.Tensor], weight: float) -> RoundResult:
        return reduce_or_rollback(
            self.collective,
            pseudo,
            compressor=self.compressor,
            reducer=self.ctx.reducer,
            weight=weight,
            timeout=self.config.sync_timeout,
        )

    def _apply(self, pending: _Pending) -> StepReport:
        t0 = time.perf_counter()
        res = pending.wait()
        self._wait_s += time.perf_counter() - t0
        self.pending = None
        f = pending.fragment
        report = round_report(res, {"fragment": float(f)})
        if not res.committed:
            self.failed_rounds += 1
            return report
        self.store.step({n: res.tensors[n] for n in self.fragments[f]}, self._mix)
        self.outer_steps[f] += 1
        self.tokens_since_sync[f] = 0
        return report

    def _mix(self, key: str, anchor: torch.Tensor) -> None:
        p = self._view(key)
        if self.mixing == 0.0:
            p.copy_(anchor)
        else:
            p.mul_(self.mixing).add_(anchor.to(p.dtype), alpha=1.0 - self.mixing)

    def state_dict(self) -> dict[str, Any]:
        """Anchor, outer momentum, counters, codec state and the in-flight fragment's outcome.

        An in-flight round is joined first (this blocks until it ends). The model parameters and the
        inner optimizer are checkpointed by the trainer, not here.
        """
        pending: dict[str, Any] = {}
        if self.pending is not None:
            res = self.pending.wait()
            pending = {
                "fragment": self.pending.fragment,
                "apply_at": self.pending.apply_at,
                "round_id": res.round_id,
                "participants": list(res.participants),
                "bytes_sent": res.bytes_sent,
                "bytes_received": res.bytes_received,
                "committed": res.committed,
                "reason": res.reason,
                "late": res.late,
                "tensors": {n: t.clone() for n, t in res.tensors.items()},
            }
        return {
            "steps": self.steps,
            "outer_steps": list(self.outer_steps),
            "failed_rounds": self.failed_rounds,
            "tokens_since_sync": list(self.tokens_since_sync),
            "fragments": [list(g) for g in self.fragments],
            "anchor": self._whole(self.store.anchor_state()),
            "outer": self.store.outer_state(),
            "compressor": compressor_state(self.compressor),
            "pending": pending,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()`` output; the fragment split must match this model's."""
        if [list(g) for g in state["fragments"]] != self.fragments:
            raise ConfigError("StreamingDiLoCo state: fragment split differs from this model's")
        anchor = dict(state["anchor"])
        for n, p in self.params.items():
            if n not in anchor or tuple(anchor[n].shape) != tuple(p.shape):
                raise ConfigError(f"StreamingDiLoCo state: anchor {n!r} missing or mis-shaped")
        if self.pending is not None:
            self.pending.wait()
        pieces = {
            k: anchor[n].reshape(-1)[lo:hi] if k != n else anchor[n] for k, (n, lo, hi) in self.pieces.items()
        }
        self.store.load(pieces, state["outer"])
        self.steps = int(state["steps"])
        self.outer_steps = [int(x) for x in state["outer_steps"]]
        self.failed_rounds = int(state["failed_rounds"])
        self.tokens_since_sync = [int(x) for x in state["tokens_since_sync"]]
        load_compressor_state(self.compressor, dict(state.get("compressor", {})))
        pend = dict(state.get("pending", {}))
        self.pending = None
        if pend:
            res = RoundResult(
                round_id=int(pend["round_id"]),
                participants=tuple(str(x) for x in pend["participants"]),
                bytes_sent=int(pend["bytes_sent"]),
                bytes_received=int(pend["bytes_received"]),
                committed=bool(pend["committed"]),
                tensors={str(n): t.clone() for n, t in dict(pend["tensors"]).items()},
                reason=str(pend["reason"]),
                late=bool(pend.get("late", False)),
            )
            self.pending = _Pending(int(pend["fragment"]), int(pend["apply_at"]), result=res)

    def close(self) -> None:
        """Wait for an in-flight round and stop the background thread."""
        if self.pending is not None and self.pending.future is not None:
            self.pending.wait()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
