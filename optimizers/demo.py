"""``DeMo``: Decoupled Momentum Optimization.

Peng, Quesnelle, Kingma 2024, "DeMo: Decoupled Momentum Optimization" (algorithm 1). Momentum stays
local; only its fast-moving components travel. Per step and parameter ``p`` with gradient ``g``:

    m <- beta * m + lr * g                          (beta = strategy.demo_decay)
    C  = DCT(m) per chunk;  q = top-k of each chunk by magnitude    (k = strategy.demo_topk)
    m <- m - IDCT(q_sent)                           (what was actually sent is removed)
    Q  = all_gather(q) over peers; per coefficient, the mean over the peers that sent it
         (with a robust reducer configured: the reducer over the peers' dense rows, see below)
    u  = IDCT(Q);  u <- sign(u) if strategy.demo_sign
    p <- p * (1 - lr * wd) - lr * u

as in the authors' reference optimizer (momentum accumulates ``lr * g``; decoupled weight decay).
``q_sent`` is ``q`` after the value encoding (fp32/fp16/bf16/sign, ``strategy.demo_values``), so the
encoding error stays in the local momentum instead of being lost.

DeMo *is* the optimizer: the context's inner optimizer is never stepped; only its ``param_groups``
are read, every step, for ``lr`` and ``weight_decay`` (so the trainer's learning-rate schedule applies).
Payloads are packed by ``optimizers.demo_payload``; a peer whose payload fails validation is left out
of that step's average (logged), and a gather that does not commit leaves parameters unchanged (the
gradient stays in the local momentum and is sent later).

Byzantine-tolerant aggregation: with a robust reducer in ``ctx.reducer`` (anything but
``None`` or the reducer named ``mean``), each tensor's gathered components are combined by that
reducer (``demo_reduce``): every peer's payload becomes one dense row of DCT coefficients in which
the coefficients it did not send are 0, and the reducer maps the ``[n_peers, n_chunks * chunk_numel]``
stack to one row. Columns that no peer sent are all-zero and are left out of the stack (every
reducer returns 0 there, and leaving them out changes no row distance). If the reducer refuses the
step (fewer payloads than its breakdown point needs, or too many non-finite rows), the step is
treated like a failed gather: nothing changes and the momentum keeps what it would have sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import torch

from optimizers.base import (
    STRATEGIES,
    StrategyContext,
    options_of,
    require_collective,
    trainable_parameters,
)
from optimizers.dct import ChunkedDCT
from optimizers.demo_payload import TensorSpec, decode_payload, encode_payload
from swarmtrain.core.config import DeMoConfig
from swarmtrain.core.errors import ConfigError, ProtocolError, UpdateRejected
from swarmtrain.core.protocols import GatherResult, Reducer, StepReport

__all__ = ["DeMo", "demo_extract", "demo_aggregate", "demo_reduce", "is_robust"]

log = logging.getLogger(__name__)


def demo_extract(coeffs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` coefficients of each chunk by magnitude: ``(idx, val)``, each ``[n_chunks, k]``."""
    idx = torch.topk(coeffs.abs(), k, dim=1, largest=True, sorted=False).indices
    return idx, torch.gather(coeffs, 1, idx)


def demo_aggregate(
    contributions: list[tuple[torch.Tensor, torch.Tensor]],
    n_chunks: int,
    chunk_numel: int,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Dense ``[n_chunks, chunk_numel]`` coefficients: per position, the mean over the peers that sent it.

    Contributions are summed in the order given, so every peer that sees them in the same order gets
    bit-identical results.
    """
    total = torch.zeros(n_chunks, chunk_numel, device=device)
    count = torch.zeros(n_chunks, chunk_numel, device=device)
    for idx, val in contributions:
        idx = idx.to(total.device)
        total.scatter_add_(1, idx, val.to(device=total.device, dtype=torch.float32))
        count.scatter_add_(1, idx, torch.ones(idx.shape, device=total.device))
    return total / count.clamp(min=1.0)


def is_robust(reducer: Reducer | None) -> bool:
    """True for a configured reducer other than the plain mean (``None`` or named ``mean``)."""
    return reducer is not None and reducer.name != "mean"


def demo_reduce(
    contributions: list[tuple[torch.Tensor, torch.Tensor]],
    n_chunks: int,
    chunk_numel: int,
    reducer: Reducer,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Dense ``[n_chunks, chunk_numel]`` coefficients: ``reducer`` over one dense row per peer.

    Row ``i`` holds peer ``i``'s sent values at its positions and 0 at every position it did not
    send (its message leaves those coefficients unchanged). Only the union of sent positions is
    stacked, ``[n_peers, U]``: the other columns are 0 in every row, where every reducer returns 0,
    and they add nothing to row distances. Same contributions in the same order give bit-identical
    results on every peer (the reducers are deterministic). Weights are all 1: robust reducers
    ignore the weights peers claim.

    Raises:
        ConfigError: the reducer refuses this many rows for its ``f`` (breakdown point).
        UpdateRejected: the reducer found more non-finite rows than it tolerates.
    """
    n = len(contributions)
    if n == 0:
        raise ConfigError("demo_reduce: no contributions")
    dev = device if device is not None else contributions[0][1].device
    base = (torch.arange(n_chunks, device=dev) * chunk_numel).unsqueeze(1)  # [n_chunks, 1]
    flat = [(idx.to(dev) + base).reshape(-1) for idx, _ in contributions]  # each [n_chunks * k]
    cols = torch.unique(torch.cat(flat))  # sorted union of sent positions, [U]
    stack = torch.zeros(n, cols.numel(), device=dev)  # [n_peers, U]
    for i, (pos, (_, val)) in enumerate(zip(flat, contributions, strict=True)):
        stack[i, torch.searchsorted(cols, pos)] = val.reshape(-1).to(device=dev, dtype=torch.float32)
    agg = reducer.reduce(stack, torch.ones(n, device=dev))  # [U]
    out = torch.zeros(n_chunks * chunk_numel, device=dev)
    out[cols] = agg.to(torch.float32)
    return out.view(n_chunks, chunk_numel)


# one decoded payload: per tensor, the (indices, values) it sent, each [n_chunks, k]
_Contribution = list[tuple[torch.Tensor, torch.Tensor]]


@STRATEGIES.register("demo")
class DeMo:
    """DeMo over an all-gather of sparse DCT payloads.

    Options come from ``ctx.config``, a ``DeMoConfig``: ``demo_chunk``, ``demo_topk``, ``demo_decay``,
    ``demo_sign``, ``demo_values``, ``sync_timeout``. A robust ``ctx.reducer`` combines the peers'
    components (``demo_reduce``); ``None`` or ``mean`` keeps the paper's per-coefficient mean over
    senders.

    Raises:
        ConfigError: without a collective, with another strategy's options, or with parameters the
            inner optimizer does not hold.
    """

    name = "demo"

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx
        self.config = cfg = options_of(ctx, DeMoConfig)
        self.collective = require_collective(ctx, self.name)
        self.mode: str = cfg.demo_values
        self.decay = float(cfg.demo_decay)
        self.sign = bool(cfg.demo_sign)
        self.params = trainable_parameters(ctx.model)
        self.transforms = {n: ChunkedDCT(tuple(p.shape), cfg.demo_chunk) for n, p in self.params.items()}
        # a tensor smaller than a chunk has fewer than demo_topk coefficients to pick from
        self.specs = [
            TensorSpec(t.n_chunks, min(cfg.demo_topk, t.chunk_numel), t.chunk_numel)
            for t in self.transforms.values()
        ]
        self.delta = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in self.params.items()}
        # the index of each parameter's group, not the group itself: ``optimizer.load_state_dict``
        # (a checkpoint resume, a peer's state adopted) replaces the group dicts, and a cached one
        # would keep the learning rate it had then while the trainer schedules the new ones
        self._group_of: dict[int, int] = {}
        for i, group in enumerate(ctx.optimizer.param_groups):
            for p in group["params"]:
                self._group_of[id(p)] = i
        missing = [n for n, p in self.params.items() if id(p) not in self._group_of]
        if missing:
            raise ConfigError(f"DeMo: parameters not in the optimizer's param_groups: {missing[:3]}")
        self.reducer: Reducer | None = ctx.reducer if is_robust(ctx.reducer) else None
        self.steps = 0
        self.failed_rounds = 0
        self.dropped_payloads = 0

    def _hyper(self, p: torch.Tensor) -> tuple[float, float]:
        group = self.ctx.optimizer.param_groups[self._group_of[id(p)]]
        return float(group["lr"]), float(group.get("weight_decay", 0.0))

    @torch.no_grad()
    def step(self, tokens: int) -> StepReport:
        """Accumulate momentum, send its top DCT components, apply the peers' average (sign-SGD).

        ``extra["comm_wait_s"]``: seconds spent inside the blocking all-gather;
        ``extra["dropped_payloads"]``: peers' payloads left out this step because they failed
        validation.
        """
        payload, sent = self._extract()
        t0 = time.perf_counter()
        res = self.collective.all_gather(payload, timeout=self.config.sync_timeout)
        wait = time.perf_counter() - t0
        if not res.committed:
            self.failed_rounds += 1
            return self._report(res, committed=False, extra={"comm_wait_s": wait})
        decoded = self._decode_peers(res)
        extra = {"dropped_payloads": float(len(res.payloads) - len(decoded)), "comm_wait_s": wait}
        try:
            averages = self._average(decoded)
        except (ConfigError, UpdateRejected) as e:
            # every member holds the same payloads, so every member refuses alike
            self.failed_rounds += 1
            name = self.reducer.name if self.reducer is not None else "mean"
            log.warning("DeMo: reducer %s refused round %s: %s", name, res.round_id, e)
            return self._report(res, committed=False, extra=extra, late=False)
        self._apply(sent, averages)
        self.steps += 1
        return self._report(res, committed=True, extra=extra, late=False)

    def _extract(self) -> tuple[bytes, _Contribution]:
        """Fold the gradients into the momentum; encode its top-k DCT components.

        Returns:
            The payload for the peers and its decoded form: exactly what the peers will see, which
            ``_apply`` removes from the momentum (so value-encoding error stays local).
        """
        items: _Contribution = []
        for (n, p), spec in zip(self.params.items(), self.specs, strict=True):
            lr, _ = self._hyper(p)
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            self.delta[n].mul_(self.decay).add_(g.to(torch.float32), alpha=lr)
            items.append(demo_extract(self.transforms[n].encode(self.delta[n]), spec.k))
        payload = encode_payload(items, self.specs, self.mode)
        return payload, decode_payload(payload, self.specs, self.mode)

    def _decode_peers(self, res: GatherResult) -> list[_Contribution]:
        """Every valid payload of the round, in peer order (the same order on every peer)."""
        decoded: list[_Contribution] = []
        for peer in sorted(res.payloads):
            try:
                decoded.append(decode_payload(res.payloads[peer], self.specs, self.mode))
            except ProtocolError as e:
                self.dropped_payloads += 1
                log.warning("DeMo: dropping payload of peer %s this step: %s", peer, e)
        return decoded

    def _average(self, decoded: list[_Contribution]) -> list[torch.Tensor] | None:
        """Per tensor, the dense ``[n_chunks, chunk_numel]`` combination of the peers' coefficients.

        Every tensor is combined before anything changes, so a reducer's refusal leaves the step
        undone. ``None`` when no payload was valid.

        Raises:
            ConfigError: the robust reducer refuses this many payloads for its ``f``.
            UpdateRejected: the robust reducer found too many non-finite rows.
        """
        if not decoded:
            return None
        out = []
        for i, (n, spec) in enumerate(zip(self.params, self.specs, strict=True)):
            rows, dev = [d[i] for d in decoded], self.delta[n].device
            if self.reducer is not None:
                out.append(demo_reduce(rows, spec.n_chunks, spec.chunk_numel, self.reducer, dev))
            else:
                out.append(demo_aggregate(rows, spec.n_chunks, spec.chunk_numel, dev))
        return out

    def _apply(self, sent: _Contribution, averages: list[torch.Tensor] | None) -> None:
        """Remove what was sent from the momentum; step every parameter by the peers' update."""
        for i, ((n, p), spec) in enumerate(zip(self.params.items(), self.specs, strict=True)):
            tr, dev = self.transforms[n], self.delta[n].device
            own = torch.zeros(spec.n_chunks, spec.chunk_numel, device=dev)
            own.scatter_(1, sent[i][0].to(dev), sent[i][1].to(dev))
            self.delta[n].sub_(tr.decode(own))
            if averages is None:
                continue
            update = tr.decode(averages[i])
            if self.sign:
                update.sign_()
            lr, wd = self._hyper(p)
            if wd:
                p.mul_(1.0 - lr * wd)  # decoupled weight decay, as in the reference optimizer
            p.add_(update.to(p.dtype), alpha=-lr)

    @staticmethod
    def _report(
        res: GatherResult, *, committed: bool, extra: dict[str, float], late: bool | None = None
    ) -> StepReport:
        """The ``StepReport`` of a step that gathered through ``res``."""
        return StepReport(
            synced=True,
            committed=committed,
            round_id=res.round_id,
            participants=len(res.participants),
            bytes_sent=res.bytes_sent,
            bytes_received=res.bytes_received,
            extra=extra,
            late=res.late if late is None else late,
            reason=res.reason,
        )

    def state_dict(self) -> dict[str, Any]:
        """The local momentum of every parameter and the counters (the model is checkpointed apart)."""
        return {
            "steps": self.steps,
            "failed_rounds": self.failed_rounds,
            "dropped_payloads": self.dropped_payloads,
            "delta": {n: t.clone() for n, t in self.delta.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()`` output (names and shapes are checked against the model)."""
        delta = dict(state["delta"])
        for n, p in self.params.items():
            if n not in delta or tuple(delta[n].shape) != tuple(p.shape):
                raise ConfigError(f"DeMo state: momentum {n!r} missing or mis-shaped")
        self.delta = {
            n: delta[n].detach().to(device=p.device, dtype=torch.float32, copy=True)
            for n, p in self.params.items()
        }
        self.steps = int(state["steps"])
        self.failed_rounds = int(state["failed_rounds"])
        self.dropped_payloads = int(state["dropped_payloads"])

    def close(self) -> None:
        return None
