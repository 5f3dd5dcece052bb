"""Replicas of one SWARM stage average their gradients (or parameters) through the run's collective.

**Gradients, at every step** (:meth:`ReplicaSync.sum_grads`, what a SWARM run uses): when the
trainers close an optimizer step, the stage's servers meet in one round (``16 * step + i``) and
sum the gradients each accumulated over the micro-batches it served (``peers.swarm.steps`` divides by
the micro-batches the trainers completed); every member
decodes the same aggregate bytes, so all apply the same step to the same parameters and stay
bit-identical, following one server that saw every micro-batch. A round that fails for a reason
other than having gone on without this server is tried again (``_ATTEMPTS`` in all). The round's
leader closes it as soon as the servers of the stage the trainer saw have joined.

**Parameters, periodically** (:meth:`ReplicaSync.maybe_sync`; a server that steps alone, and the last
average when a run ends): every server of a stage trains its own copy of the stage on the
micro-batches routed to it; every ``period`` seconds of DHT time the servers of the stage meet in one round of
:class:`peers.rounds.collective.P2PCollective` (each stage is its own group: the rounds namespace is
``<run>.stage<k>``) and replace their parameters by the mean (any codec: every member decodes the same
aggregate bytes, so a committed round leaves them bit-identical). Optimizer states stay local.
Adding the replicas' updates instead (``a + k * mean(p_i - a)``) was tried and is worse: summed
updates that each replica took from the same point overshoot like stale gradients (figures in
docs/decisions.md).

After each committed average (or every few steps, :meth:`ReplicaSync.vouch`) a server serves the
stage's parameters, and with an ``optimizer`` its optimizer state, to newcomers
(``peers.state.state_transfer.StateServer`` in the stage's namespace) and vouches for their digest
(:func:`params_digest`); a server that joins a stage others already serve downloads them
(:meth:`ReplicaSync.adopt`, or :meth:`ReplicaSync.fetch` and :meth:`ReplicaSync.load` while it
catches up with the stage's steps): only a state donors vouched for, with exactly the stage's names,
shapes and dtypes, finite, and hashing to the vouched digest.

Rounds are numbered by the period's index of DHT time, so servers that check at different moments of
the same period meet in the same round without agreeing on a counter first; a server that misses
one (busy with a long request, or late) fails that round and meets the others at the next.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

import torch

from peers.dht.node import PeerNode, dht_time
from peers.rounds.collective import P2PCollective
from peers.state.state_transfer import StateServer, download_state
from swarmtrain.core.errors import ConfigError, PeerTimeoutError, ProtocolError
from swarmtrain.core.protocols import Compressor, RoundResult

__all__ = ["ReplicaSync", "FINAL_ROUND", "OPT_KEYS", "params_digest"]

logger = logging.getLogger(__name__)

#: round number of the last sync, when every server of the stage leaves at the end of a run
FINAL_ROUND = 1 << 40
_ATTEMPTS = 4  # rounds per gradient sum
#: rounds of one step: ``16 * step + i`` (a sum short of micro-batches is summed again after them)
_ROUNDS_PER_STEP = 16
#: the optimizer state a snapshot may carry per parameter (AdamW's), as ``opt.<param>.<key>``
OPT_KEYS = ("step", "exp_avg", "exp_avg_sq")


def params_digest(params: Mapping[str, torch.Tensor]) -> bytes:
    """SHA-256 over the names, shapes, dtypes and bytes of ``params`` in name order."""
    h = hashlib.sha256()
    for name in sorted(params):
        t = params[name].detach().contiguous().cpu()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # reshape: 0-dim too (a step count)
    return h.digest()


class ReplicaSync:
    """Periodic parameter averaging among the servers of one stage.

    Args:
        node: this server's started node.
        stage: the stage it serves.
        params: the stage's parameters (averaged in place).
        compressor: codec of the averaging round.
        period: seconds of DHT time between two syncs.
        timeout: seconds one sync round may take.
        join_window: seconds a round's leader waits for the stage's other servers.
        optimizer: when given, snapshots carry its state (replicas that step together share it).
    """

    def __init__(
        self,
        node: PeerNode,
        stage: int,
        params: Mapping[str, torch.Tensor],
        compressor: Compressor,
        *,
        period: float = 5.0,
        timeout: float = 20.0,
        join_window: float = 1.0,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        if not period > 0 or not timeout > 0:
            raise ConfigError("sync period and timeout must be > 0")
        self.stage = stage
        self.params = dict(params)
        self.optimizer = optimizer
        self.compressor = compressor
        self.period = float(period)
        self.timeout = float(timeout)
        self.node = node
        self.namespace = f"{node.run_id}.stage{stage}"
        self.collective = P2PCollective(node, run_id=self.namespace, min_peers=1, join_window=join_window)
        self._round = 0
        self.state_server = StateServer(node, self._provide, run_id=self.namespace)
        self._last = self._epoch()
        self.committed = 0
        self.failed = 0
        self.last_group = 0
        self._summed = (-1, -1)  # the step last summed, and the last round used for it

    def _epoch(self) -> int:
        return int(dht_time() // self.period)

    def due(self) -> bool:
        """True when a new period began since the last sync."""
        return self._epoch() > self._last

    def maybe_sync(self) -> RoundResult | None:
        """Sync when a new period began (call it between requests); ``None`` when not due."""
        e = self._epoch()
        if e <= self._last:
            return None
        self._last = e
        return self.sync(e)

    @torch.no_grad()
    def sync(self, round_id: int, weight: float = 1.0) -> RoundResult:
        """Average the parameters with the stage's servers in round ``round_id`` (rounds only go up),
        this server's with ``weight`` (0: it takes the others' mean without adding its own)."""
        if round_id < self.collective.round_id:
            raise ConfigError(f"sync round {round_id} is behind the collective's {self.collective.round_id}")
        self.collective.round_id = round_id
        tensors = {k: v.detach().clone() for k, v in self.params.items()}
        res = self.collective.all_reduce(
            tensors, compressor=self.compressor, weight=weight, timeout=self.timeout, kind="stage"
        )
        if res.committed:
            for k, v in res.tensors.items():
                self.params[k].copy_(v)
            self.committed += 1
            self.last_group = len(res.participants)
            self._round = round_id
            self.state_server.refresh(vouch=params_digest(self._tensors()).hex())
        else:
            self.failed += 1
            logger.info("stage %d sync round %d failed: %s", self.stage, round_id, res.reason)
        return res

    @torch.no_grad()
    def sum_grads(
        self, step: int, expected: int, grads: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor] | None:
        """The sum of ``grads`` over the stage's servers for optimizer step ``step`` (a
        ``peers.swarm.steps.StepSync``): the round's mean (equal weights) times its members.

        Args:
            step: the step being taken (rounds only go up).
            expected: servers of the stage the closing trainers saw (the leader closes the round as
                soon as that many joined).
            grads: this server's gradient sums over the micro-batches it served (zeros when none: it
                still joins, so the round's members step together).

        Returns:
            The stage's sums, identical on every member; ``None`` when no round committed with this
            server in it (it then steps on its own gradients).
        """
        base = step * _ROUNDS_PER_STEP
        if base + _ROUNDS_PER_STEP <= self.collective.round_id:
            raise ConfigError(f"step {step}'s rounds are behind the collective's {self.collective.round_id}")
        # a step summed again (the last sum was short of micro-batches) goes on after its last round:
        # the replicas were all in that round, so they meet again in the next ones
        start = self._summed[1] + 1 if self._summed[0] == step else base
        if start + _ATTEMPTS > base + _ROUNDS_PER_STEP:
            self.failed += 1
            logger.warning("stage %d: step %d was summed too often; no round left", self.stage, step)
            return None
        # the collective's public knob is fixed at construction; the stage's size changes as servers
        # die or join, and the trainers see it
        self.collective._matchmaker.expected_peers = max(1, int(expected))
        reason = ""
        for attempt in range(_ATTEMPTS):
            self.collective.round_id = start + attempt
            self._summed = (step, start + attempt)
            res = self.collective.all_reduce(
                grads, compressor=self.compressor, timeout=self.timeout, kind="stage"
            )
            if res.committed:
                self.committed += 1
                self.last_group = k = len(res.participants)
                return {n: t * k for n, t in res.tensors.items()}
            reason = res.reason
            if res.late:  # the others stepped without this server: trying again meets no one
                break
        self.failed += 1
        logger.warning("stage %d: no gradient round for step %d: %s", self.stage, step, reason)
        return None

    def vouch(self, version: int) -> None:
        """Serve the current parameters (after ``version`` steps) to newcomers and vouch for them:
        replicas that step together hold the same parameters at the same version."""
        self._round = int(version)
        self._last = self._epoch()
        self.state_server.refresh(vouch=params_digest(self._tensors()).hex())

    def _tensors(self) -> dict[str, torch.Tensor]:
        """The parameters, and the optimizer's state as ``opt.<param>.<key>``."""
        out = dict(self.params)
        if self.optimizer is not None:
            for name, p in self.params.items():
                for key, t in self.optimizer.state.get(p, {}).items():
                    if key in OPT_KEYS and isinstance(t, torch.Tensor):
                        out[f"opt.{name}.{key}"] = t
        return out

    def _provide(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        return {k: v.detach().clone() for k, v in self._tensors().items()}, {"round": self._round}

    def _check(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any], digest: bytes | None) -> None:
        if digest is None:
            raise ProtocolError("the stage state is not vouched for")
        if not set(self.params) <= set(tensors):
            raise ProtocolError("the stage state lacks some of this stage's tensors")
        per_param: dict[str, int] = {}
        for k, t in tensors.items():
            name, want = self._expected(k)
            p = self.params[name]
            per_param[name] = per_param.get(name, 0) + 1
            if t.shape != want or t.dtype != p.dtype or not bool(torch.isfinite(t).all()):
                raise ProtocolError(f"stage tensor {k[:80]!r} has another shape/dtype or non-finite values")
        counts = set(per_param.values())  # every parameter alone, or every one with all its state
        if counts not in ({1}, {1 + len(OPT_KEYS)}):
            raise ProtocolError("the stage state has optimizer state for only some parameters or keys")
        if params_digest(tensors) != digest:
            raise ProtocolError("the stage state does not hash to the digest its donors vouched for")

    def _expected(self, key: str) -> tuple[str, tuple[int, ...]]:
        """The parameter a snapshot's tensor ``key`` belongs to, and the shape it must have.

        Raises:
            ProtocolError: a name that is neither a parameter nor its optimizer state.
        """
        if key in self.params:
            return key, tuple(self.params[key].shape)
        name, _, what = key.removeprefix("opt.").rpartition(".")
        if self.optimizer is None or not key.startswith("opt.") or name not in self.params:
            raise ProtocolError(f"the stage state has a tensor {key[:80]!r} this stage does not")
        if what not in OPT_KEYS:
            raise ProtocolError(f"the stage state has optimizer state {what[:20]!r}")
        return name, () if what == "step" else tuple(self.params[name].shape)

    def fetch(self, min_round: int, timeout: float) -> tuple[dict[str, torch.Tensor], int]:
        """A vouched snapshot of the stage of step ``min_round`` or later (an older one when none
        came within ``timeout``; the caller checks). Returns the tensors and their step.

        Raises:
            PeerTimeoutError: no donor served a vouched state in time.
        """
        tensors, meta = download_state(
            self.node,
            timeout,
            run_id=self.namespace,
            vouchers=2,
            wait_for_donor=timeout,
            min_round=min_round,
            fresh_wait=timeout,
            check=self._check,
        )
        return tensors, int(meta["round"])

    @torch.no_grad()
    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy a checked snapshot (:meth:`fetch`) into the parameters and the optimizer's state."""
        for k, p in self.params.items():
            p.copy_(tensors[k])
        if self.optimizer is None:
            return
        for k, p in self.params.items():
            names = {key: f"opt.{k}.{key}" for key in OPT_KEYS}
            opt = self.optimizer
            state = {key: _placed(opt, key, tensors[n], p) for key, n in names.items() if n in tensors}
            if state:
                self.optimizer.state[p] = state
            else:
                self.optimizer.state.pop(p, None)

    @torch.no_grad()
    def adopt(self, timeout: float = 60.0) -> bool:
        """Take the parameters the stage's other servers vouch for (call before serving). Returns
        False, with a warning, when no donor served a vouched state in time (the server then starts
        from its own parameters, and the next average brings it towards the others)."""
        try:
            tensors, self._round = self.fetch(0, timeout)  # any round: the freshest vouched
        except PeerTimeoutError as e:
            logger.warning("stage %d: no replica's state to adopt: %s", self.stage, e)
            return False
        self.load(tensors)
        logger.info("stage %d: adopted round %d's state", self.stage, self._round)
        return True

    def close(self) -> None:
        """Stop taking rounds and serving the state."""
        self.state_server.close()
        self.collective.close()


def _placed(optimizer: torch.optim.Optimizer, key: str, t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """A downloaded optimizer state tensor where ``optimizer`` keeps it for ``p``: beside the parameter,
    except Adam's ``step``, which torch keeps on the host unless the optimizer is fused or capturable
    (the same rule as ``Optimizer.load_state_dict``)."""
    if key == "step" and not (optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")):
        return t.clone()
    return t.to(p.device, copy=True)
