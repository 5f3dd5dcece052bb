"""In-process simulation of ``n`` peers training one tiny byte-level model under attack.

Used by ``benchmarks/byzantine.py``. Each simulated peer is a thread with its own model, its own
inner optimizer (``torch.optim.Adam``) and its own strategy built by ``optimizers.build_strategy``
(``data_parallel`` or ``diloco``: the code real peers run) on one member of an
``optimizers.inprocess.InProcessGroup``. Peers sample their own batches of real text (the Python
standard library's sources). The reducer under test (``peers.reducers``) combines one row per peer,
as the partition owner does in the network all-reduce.

Attackers are peers ``0 .. f-1`` and use ``swarmtrain.simulation.attacks``:

* update level (sign flip, random direction, noise, ALIE, IPM, stale): the attacker's row is replaced
  by ``forge_rows`` on the stack the reducer receives. This is the papers' *omniscient* attacker (ALIE
  and IPM see the honest rows of the same round); real peers, which cannot, run them through
  ``AttackingCollective`` and estimate the honest rows from the colluders' own
  (``benchmarks/byzantine.py --real-peers``);
* data level (label flip): the attacker trains on ``attack.transform_batch`` of its batches;
* owner level (malicious owner): each tensor is cut into ``n`` partitions as in the butterfly
  all-reduce, partition ``j`` is reduced by peer ``j``, and a malicious owner returns
  ``corrupt_aggregate`` of its partition.

The forging and the partitioning live in ``AttackedReducer`` (a ``Reducer`` wrapper, benchmark
code); the collective, the strategies, the reducers and the attacks are the library's.

The model: the previous ``CONTEXT`` bytes -> embeddings -> one tanh hidden layer -> next-byte logits.
"""

from __future__ import annotations

import copy
import math
import sysconfig
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from optimizers import InProcessGroup, StrategyContext, build_strategy
from peers.reducers import BaseReducer
from swarmtrain.core.config import CompressionConfig, strategy_config
from swarmtrain.core.errors import SwarmError
from swarmtrain.simulation.attacks import Attack, build_attack, forge_rows

__all__ = ["SimConfig", "load_corpus", "run_sim", "ByteMLP", "AttackedReducer"]

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
    lr: float = 3e-3  # inner Adam lr (both strategies)
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
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
    """Peers sample i.i.d. windows of the training bytes, each with its own generator (so a run does
    not depend on thread scheduling); the corpus tail is a fixed validation set."""

    def __init__(self, corpus: torch.Tensor, n: int, context: int, seed: int) -> None:
        val_len = len(corpus) // 20
        self.train, val = corpus[:-val_len].long(), corpus[-val_len:].long()
        self.context = context
        self.gens = [torch.Generator().manual_seed(seed * 100_003 + 1 + i) for i in range(n)]
        g = torch.Generator().manual_seed(12345)
        pos = torch.randint(0, len(val) - context - 1, (4096,), generator=g)
        offs = torch.arange(context)
        self.val_x, self.val_y = val[pos[:, None] + offs], val[pos + context]

    def batch(self, peer: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[b, context]``, ``y`` ``[b]``: peer ``peer``'s next batch."""
        pos = torch.randint(0, len(self.train) - self.context - 1, (b,), generator=self.gens[peer])
        return self.train[pos[:, None] + torch.arange(self.context)], self.train[pos + self.context]


class AttackedReducer:
    """A ``Reducer`` that lets the simulated attackers act on the round, then applies ``inner``.

    Args:
        inner: the reducer under test.
        n: peers (rows per stack, in member order).
        attackers: row index -> a factory of that peer's ``Attack`` (one instance per tensor, so
            stateful attacks such as ``stale`` keep a memory per tensor, as ``AttackingCollective``).
        tensors_per_round: how many tensors each all-reduce carries; the collective reduces them in
            the same order every round, so ``call index % tensors_per_round`` names the tensor.
        seed: seed of the randomised attacks.
    """

    name = "attacked"

    def __init__(
        self,
        inner: BaseReducer,
        n: int,
        attackers: dict[int, Attack],
        tensors_per_round: int,
        seed: int = 0,
    ) -> None:
        self.inner = inner
        self.n = n
        self.k = tensors_per_round
        self.calls = 0
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.update = {i: a for i, a in attackers.items() if not (a.data_level or a.owner_level)}
        self.owners = {i: a for i, a in attackers.items() if a.owner_level}
        # per tensor slot, per attacker: its own instance (stateful attacks)
        self._per_tensor = [
            {i: copy.deepcopy(a) for i, a in self.update.items()} for _ in range(tensors_per_round)
        ]

    def reduce(self, stack: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        slot = self.calls % self.k
        self.calls += 1
        if self.update:
            stack = forge_rows(stack, self._per_tensor[slot], generator=self.generator)
        if not self.owners:
            return self.inner.reduce(stack, weights)
        m = stack.shape[1]
        out = torch.empty(m, dtype=stack.dtype)
        bounds = torch.linspace(0, m, self.n + 1).long().tolist()
        for j in range(self.n):
            lo, hi = bounds[j], bounds[j + 1]
            if lo == hi:
                continue
            part = self.inner.reduce(stack[:, lo:hi], weights)
            if j in self.owners:
                part = self.owners[j].corrupt_aggregate(part, stack[:, lo:hi], generator=self.generator)
            out[lo:hi] = part
        return out


def _strategy_config(cfg: SimConfig) -> Any:
    if cfg.strategy == "diloco":
        return strategy_config(
            "diloco",
            inner_steps=cfg.inner_steps,
            outer_lr=cfg.outer_lr,
            outer_momentum=cfg.outer_momentum,
            nesterov=True,
            sync_timeout=120.0,
        )
    if cfg.strategy == "data_parallel":
        return strategy_config("data_parallel", sync_timeout=120.0)
    raise ValueError(f"unknown strategy {cfg.strategy!r}")


def run_sim(cfg: SimConfig, reducer: BaseReducer, corpus: torch.Tensor) -> dict[str, Any]:
    """Train under ``cfg`` with ``reducer``; return the final validation loss (nats/byte) and status.

    Attackers are peers ``0 .. n_attackers-1``. A run whose parameters become non-finite ends as
    ``diverged``, one whose reducer rejects a round (``SwarmError``) as ``rejected``; both with loss
    ``inf``. ``params_identical``: every peer ended with the same parameters (bit for bit).
    """
    n, f = cfg.n_peers, cfg.n_attackers
    torch.manual_seed(cfg.seed)
    proto = ByteMLP()
    data = _Data(corpus, n, proto.context, cfg.seed)
    opts: dict[str, Any] = {"n_peers": n, "n_byzantine": f} if cfg.attack == "alie" else {}
    opts.update(dict(cfg.attack_options))
    if "delay" in opts:
        opts["delay"] = int(opts["delay"])
    attackers = {i: build_attack(cfg.attack, **opts) for i in range(f)} if cfg.attack != "none" else {}
    flip = {i: a for i, a in attackers.items() if a.data_level}
    scfg = _strategy_config(cfg)
    n_tensors = 1 if cfg.strategy == "data_parallel" else len(list(proto.parameters()))
    wrapped = AttackedReducer(reducer, n, attackers, n_tensors, seed=cfg.seed)
    group = InProcessGroup(n, timeout=300.0)
    models = [copy.deepcopy(proto) for _ in range(n)]
    steps = cfg.rounds * (cfg.inner_steps if cfg.strategy == "diloco" else 1)
    status = ["ok"] * n
    lock = threading.Lock()

    def peer(i: int) -> None:
        torch.set_num_threads(1)
        model = models[i]
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        ctx = StrategyContext(
            model=model,
            optimizer=opt,
            config=scfg,
            compression=CompressionConfig(codec="none"),
            collective=group[i],
            reducer=wrapped,
        )
        strategy = build_strategy(ctx)
        try:
            for _ in range(steps):
                x, y = data.batch(i, cfg.batch)
                if i in flip:
                    x, y = flip[i].transform_batch(x, y)
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                report = strategy.step(tokens=int(y.numel()))
                if not report.synced:
                    continue
                if not report.committed:
                    with lock:
                        if status[i] == "ok":
                            status[i] = "rejected: round did not commit"
                    break
                if not all(bool(torch.isfinite(p).all()) for p in model.parameters()):
                    status[i] = "diverged"  # every peer holds the same parameters after a sync
                    break
        except SwarmError as e:
            status[i] = f"rejected: {e}"
            group._shared.barrier.abort()  # the others leave their round at once (benchmark only)
        except BaseException as e:  # noqa: BLE001 - reported in the row, and the group released
            status[i] = f"error: {type(e).__name__}: {e}"
            group._shared.barrier.abort()
        finally:
            strategy.close()

    threads = [threading.Thread(target=peer, args=(i,), name=f"peer{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = next((s for s in status if s.startswith(("rejected", "error"))), None)
    if bad is None:
        bad = "diverged" if "diverged" in status else None
    if bad is not None:
        return {"loss": math.inf, "status": bad, "params_identical": None}
    ref = [p.detach() for p in models[0].parameters()]
    identical = all(
        all(torch.equal(a, b.detach()) for a, b in zip(ref, m.parameters(), strict=True)) for m in models[1:]
    )
    with torch.no_grad():
        loss = float(torch.nn.functional.cross_entropy(models[0](data.val_x), data.val_y))
    return {
        "loss": loss if math.isfinite(loss) else math.inf,
        "status": "ok" if math.isfinite(loss) else "diverged",
        "params_identical": identical,
    }
