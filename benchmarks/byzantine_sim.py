"""Vectorised in-process simulation of ``n`` peers training one tiny byte-level model under attack.

Used by ``benchmarks/byzantine.py``. Every simulated peer samples its own batches of real text (the
Python standard library's sources), computes its own gradient (DataParallel) or pseudo-gradient after ``H``
local AdamW steps (DiLoCo, Douillard et al. 2023) with ``torch.func.vmap`` over peers; attacking
peers replace their row
(``swarmtrain.simulation.attacks``), poison their batches (label flip) or, as partition
owners, corrupt the aggregate of their partition; the reducer under test (``peers.reducers``)
combines the rows. This is an honest in-process collective: the same rows reach the same reducer as
in the network all-reduce, only without the network.

The model: the previous ``CONTEXT`` bytes -> embeddings -> one tanh hidden layer -> next-byte logits.
"""

from __future__ import annotations

import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.func import functional_call, grad, vmap

from peers.reducers import BaseReducer
from swarmtrain.core.errors import SwarmError
from swarmtrain.simulation.attacks import Attack, build_attack, forge_rows

__all__ = ["SimConfig", "load_corpus", "run_sim", "ByteMLP"]

VOCAB = 256


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. ``rounds`` counts reductions (DataParallel: steps; DiLoCo: outer rounds)."""

    strategy: str  # "data_parallel" | "diloco"
    n_peers: int
    n_attackers: int
    attack: str  # a swarmtrain.simulation.attacks name ("none": clean)
    rounds: int
    inner_steps: int = 1  # DiLoCo H
    batch: int = 32
    lr: float = 3e-3  # DataParallel Adam lr / DiLoCo inner AdamW lr
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    worker_momentum: float = 0.0  # DataParallel: peers send m_i <- b*m_i + (1-b)*g_i (Karimireddy 2021)
    attack_options: tuple[tuple[str, float], ...] = ()
    seed: int = 0


class ByteMLP(torch.nn.Module):
    """Next-byte predictor from the previous ``context`` bytes (a few tens of thousands of weights)."""

    def __init__(self, context: int = 8, embed: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.context = context
        self.emb = torch.nn.Embedding(VOCAB, embed)
        self.fc1 = torch.nn.Linear(context * embed, hidden)
        self.fc2 = torch.nn.Linear(hidden, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, context] int64 -> [B, 256]
        h = torch.tanh(self.fc1(self.emb(x).flatten(1)))
        return self.fc2(h)


def load_corpus(max_bytes: int = 1 << 21) -> torch.Tensor:
    """The first ``max_bytes`` bytes of the stdlib's ``.py`` files, in sorted path order (uint8)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(chunks)[:max_bytes]), dtype=torch.uint8).clone()


class _Data:
    """Peers sample i.i.d. windows of the training bytes, each with its own generator; the corpus tail
    is a fixed validation set."""

    def __init__(self, corpus: torch.Tensor, n: int, context: int, seed: int) -> None:
        val_len = len(corpus) // 20
        self.train, val = corpus[:-val_len].long(), corpus[-val_len:].long()
        self.n, self.context = n, context
        self.gen = torch.Generator().manual_seed(seed)
        g = torch.Generator().manual_seed(12345)
        pos = torch.randint(0, len(val) - context - 1, (4096,), generator=g)
        offs = torch.arange(context)
        self.val_x, self.val_y = val[pos[:, None] + offs], val[pos + context]

    def batch(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[n, b, context]``, ``y`` ``[n, b]``: one batch per peer."""
        pos = torch.randint(0, len(self.train) - self.context - 1, (self.n, b), generator=self.gen)
        x = self.train[pos[:, :, None] + torch.arange(self.context)]
        y = self.train[pos + self.context]
        return x, y


def _flat(tree: dict[str, torch.Tensor], lead: int | None = None) -> torch.Tensor:
    if lead is None:
        return torch.cat([t.reshape(-1) for t in tree.values()])
    return torch.cat([t.reshape(lead, -1) for t in tree.values()], dim=1)


def _unflat(flat: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, i = {}, 0
    for k, t in like.items():
        out[k] = flat[i : i + t.numel()].view_as(t)
        i += t.numel()
    return out


class _Adam:
    """Adam over a flat ``[..., P]`` tensor (vectorised over peers when it has a leading dim)."""

    def __init__(self, like: torch.Tensor, lr: float, beta1: float = 0.9) -> None:
        self.m, self.v, self.t = torch.zeros_like(like), torch.zeros_like(like), 0
        self.lr, self.beta1 = lr, beta1

    def step(self, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        self.t += 1
        self.m.mul_(self.beta1).add_(g, alpha=1 - self.beta1)
        self.v.mul_(0.999).addcmul_(g, g, value=0.001)
        mhat = self.m / (1 - self.beta1**self.t)
        vhat = self.v / (1 - 0.999**self.t)
        return p - self.lr * mhat / (vhat.sqrt() + 1e-8)


def _reduce_with_owners(
    stack: torch.Tensor, reducer: BaseReducer, owners: dict[int, Attack], n: int
) -> torch.Tensor:
    """Butterfly-style: the flat vector is cut into ``n`` partitions; partition ``j`` is reduced by
    peer ``j``, which (if it is a malicious owner) corrupts that partition's aggregate."""
    w = torch.ones(stack.shape[0])
    if not owners:
        return reducer.reduce(stack, w)
    out = torch.empty(stack.shape[1])
    bounds = torch.linspace(0, stack.shape[1], n + 1).long().tolist()
    for j in range(n):
        part = reducer.reduce(stack[:, bounds[j] : bounds[j + 1]], w)
        if j in owners:
            part = owners[j].corrupt_aggregate(part, stack[:, bounds[j] : bounds[j + 1]])
        out[bounds[j] : bounds[j + 1]] = part
    return out


def run_sim(cfg: SimConfig, reducer: BaseReducer, corpus: torch.Tensor) -> dict[str, float | str]:
    """Train under ``cfg`` with ``reducer``; return the final validation loss (nats/byte) and status.

    Attackers are peers ``0 .. n_attackers-1``. A run whose parameters become non-finite, or whose
    reducer rejects the round, ends as ``diverged`` with loss ``inf``.
    """
    torch.manual_seed(cfg.seed)
    model = ByteMLP()
    names_params = {k: v.detach() for k, v in model.named_parameters()}
    theta = _flat(names_params).clone()  # [P] the shared (global) parameters
    n, f = cfg.n_peers, cfg.n_attackers
    data = _Data(corpus, n, model.context, cfg.seed)
    opts: dict[str, float] = {"n_peers": n, "n_byzantine": f} if cfg.attack == "alie" else {}
    opts.update(dict(cfg.attack_options))
    attackers = {i: build_attack(cfg.attack, **opts) for i in range(f)} if cfg.attack != "none" else {}
    update_attackers = {i: a for i, a in attackers.items() if not (a.data_level or a.owner_level)}
    owners = {i: a for i, a in attackers.items() if a.owner_level}
    flip = [i for i, a in attackers.items() if a.data_level]
    gen = torch.Generator().manual_seed(cfg.seed + 1)

    def loss_fn(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = functional_call(model, _unflat(flat, names_params), (x,))
        return torch.nn.functional.cross_entropy(logits, y)

    per_peer_grad = vmap(grad(loss_fn))  # ([n,P], [n,B,k], [n,B]) -> [n,P]

    def peer_batches() -> tuple[torch.Tensor, torch.Tensor]:
        x, y = data.batch(cfg.batch)
        for i in flip:
            x[i], y[i] = attackers[i].transform_batch(x[i], y[i])
        return x, y

    status = "ok"
    try:
        if cfg.strategy == "data_parallel":
            # With worker momentum the rows already carry the first moment: the update is RMSprop-like.
            opt = _Adam(theta, cfg.lr, beta1=0.0 if cfg.worker_momentum else 0.9)
            worker_m = torch.zeros(n, theta.shape[0])
            for _ in range(cfg.rounds):
                x, y = peer_batches()
                grads = per_peer_grad(theta.expand(n, -1), x, y)  # [n, P]
                if cfg.worker_momentum:
                    worker_m.mul_(cfg.worker_momentum).add_(grads, alpha=1 - cfg.worker_momentum)
                    grads = worker_m
                grads = forge_rows(grads, update_attackers, generator=gen)
                theta = opt.step(theta, _reduce_with_owners(grads, reducer, owners, n))
                if not bool(torch.isfinite(theta).all()):
                    status = "diverged"
                    break
        elif cfg.strategy == "diloco":
            inner = _Adam(theta.expand(n, -1).clone(), cfg.lr)
            momentum = torch.zeros_like(theta)
            for _ in range(cfg.rounds):
                local = theta.expand(n, -1).clone()  # [n, P]
                for _ in range(cfg.inner_steps):
                    x, y = peer_batches()
                    local = inner.step(local, per_peer_grad(local, x, y))
                pseudo = forge_rows(theta[None, :] - local, update_attackers, generator=gen)  # [n, P]
                delta = _reduce_with_owners(pseudo, reducer, owners, n)
                momentum = cfg.outer_momentum * momentum + delta
                theta = theta - cfg.outer_lr * (delta + cfg.outer_momentum * momentum)  # Nesterov
                if not bool(torch.isfinite(theta).all()):
                    status = "diverged"
                    break
        else:
            raise ValueError(f"unknown strategy {cfg.strategy!r}")
    except SwarmError as e:
        status = f"rejected: {e}"
    if status != "ok":
        return {"loss": math.inf, "status": status}
    with torch.no_grad():
        loss = float(loss_fn(theta, data.val_x, data.val_y))
    return {
        "loss": loss if math.isfinite(loss) else math.inf,
        "status": "ok" if math.isfinite(loss) else "diverged",
    }
