"""DeMo and StreamingDiLoCo between real peer processes on 127.0.0.1 (hivemind P2P streams).

Each peer trains the same tiny residual model on its own data through ``peers.P2PCollective``:
DeMo for a few steps (identical parameters on every peer after *each* step, loss going down), then
Streaming DiLoCo with a fragment in flight in a background thread while training continues
(identical fragments on every peer right after each fragment's sync).
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import torch
from peer_helpers import Fp32Identity, PeerGroup, loopback_config, report, reporting_errors

N_PEERS = 3
DEMO_STEPS = 6
STREAM_STEPS = 12


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 16)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        self.head = torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = h + torch.tanh(b(h))
        return self.head(h)


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(32, 4, generator=g)
    return x, torch.stack([x[:, 0] * x[:, 1], torch.sin(x[:, 2]) + x[:, 3]], dim=1)


def _digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        h.update(k.encode())
        h.update(tensors[k].detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _loss(model: torch.nn.Module, rank: int, step: int) -> float:
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(_batch(rank, step)[0]), _batch(rank, step)[1])
    loss.backward()
    return float(loss.detach())


def worker(rank: int, initial: list[str], q: Any, n: int) -> None:
    from optimizers import StrategyContext, build_strategy
    from peers import P2PCollective, PeerNode
    from swarmtrain.core.config import CompressionConfig, DeMoConfig, StreamingDiLoCoConfig

    with reporting_errors(q, rank), PeerNode(loopback_config("t-strat", initial)) as node:
        report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
        coll = P2PCollective(node, min_peers=n, expected_peers=n)

        torch.manual_seed(0)
        model = Tiny()
        opt = torch.optim.SGD(model.parameters(), lr=2e-3)
        cfg = DeMoConfig(demo_chunk=8, demo_topk=4, demo_values="fp16", sync_timeout=60)
        demo = build_strategy(
            StrategyContext(model, opt, cfg, CompressionConfig(), coll, None, Fp32Identity())
        )
        steps = []
        for s in range(DEMO_STEPS):
            loss = _loss(model, rank, s % 2)
            rep = demo.step(32)
            steps.append(
                (
                    loss,
                    rep.committed,
                    rep.participants,
                    rep.bytes_sent,
                    _digest(dict(model.named_parameters())),
                )
            )
        report(q, "demo", rank, steps)

        torch.manual_seed(1)
        model = Tiny()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        cfg = StreamingDiLoCoConfig(inner_steps=4, fragments=2, overlap=1, mixing=0.0)
        strat = build_strategy(
            StrategyContext(model, opt, cfg, CompressionConfig(), coll, None, Fp32Identity())
        )
        frags = strat.fragments  # type: ignore[attr-defined]
        synced = []
        for s in range(STREAM_STEPS):
            _loss(model, rank, s)
            rep = strat.step(32)
            if rep.synced:
                f = int(rep.extra["fragment"])
                part = {k: v for k, v in model.named_parameters() if k in frags[f]}
                synced.append((s + 1, f, rep.committed, _digest(part)))
        strat.close()
        report(q, "stream", rank, synced)


@pytest.mark.slow
def test_demo_and_streaming_diloco_over_real_peers() -> None:
    with PeerGroup(worker, N_PEERS, args=(N_PEERS,)) as g:
        demo = g.collect("demo", 180)
        stream = g.collect("stream", 180)
    assert g.orphans == []
    for s in range(DEMO_STEPS):
        rows = [demo[r][s] for r in range(N_PEERS)]
        assert all(row[1] and row[2] == N_PEERS and row[3] > 0 for row in rows), rows
        assert len({row[4] for row in rows}) == 1, f"parameters differ across peers after DeMo step {s}"
    first = sum(demo[r][0][0] + demo[r][1][0] for r in range(N_PEERS))
    last = sum(demo[r][-2][0] + demo[r][-1][0] for r in range(N_PEERS))
    assert last < first  # same two batches per peer, seen again after 4 DeMo steps
    # H=4, F=2: fragment 1 sent at steps 2, 6, 10 and fragment 0 at 4, 8 (12 is still in flight at
    # the end); each applied tau = 1 step later
    for r in range(N_PEERS):
        assert [(s, f) for s, f, _, _ in stream[r]] == [(3, 1), (5, 0), (7, 1), (9, 0), (11, 1)]
        assert all(c for _, _, c, _ in stream[r]), stream[r]
    for k in range(len(stream[0])):
        assert len({stream[r][k][3] for r in range(N_PEERS)}) == 1, f"fragment differs at sync {k}"
