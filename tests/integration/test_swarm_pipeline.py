"""A 2-stage SWARM pipeline over real peers gives the single-process model's loss and gradients.

Three real processes on 127.0.0.1 (hivemind DHT + libp2p streams): a server of stage 0, a server of
stage 1, and a trainer that sends one micro-batch forward and backward through them with fp32
hidden states (codec ``none``). Each server's optimizer records the gradients it is asked to apply.
The reference is the whole tied GPT in this process: its loss, each block's gradients, and the tied
weight's gradient as the sum of the embedding's (stage 0) and the head's (stage 1).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import pytest
import torch
from peer_helpers import (
    PeerGroup,
    loopback_config,
    report,
    reporting_errors,
    tensor_bytes,
    tensor_from_bytes,
)

SPEC_ARGS = {"n_layer": 4, "n_head": 4, "n_embd": 64, "block_size": 32, "vocab_size": 256}
SEED = 7
BATCH = 4


class GradRecorder(torch.optim.Optimizer):
    """An optimizer that keeps a copy of the gradients it is stepped with (and changes nothing)."""

    def __init__(self, params: Iterable[torch.nn.Parameter]) -> None:
        super().__init__(params, {})
        self.grads: list[torch.Tensor] | None = None

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        self.grads = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]


def _micro_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    xy = torch.randint(0, 256, (BATCH, SPEC_ARGS["block_size"] + 1), generator=g)
    return xy[:, :-1], xy[:, 1:]


def _worker(rank: int, initial: list[str], q: Any) -> None:
    from compression import NoneCompressor
    from peers.dht.node import PeerNode
    from swarmtrain.app.models import GPTSpec
    from swarmtrain.app.models.stages import build_stages

    torch.set_num_threads(1)
    spec = GPTSpec(**SPEC_ARGS)
    with (
        reporting_errors(q, rank),
        PeerNode(loopback_config("swarm-eq", initial), role="server" if rank < 2 else "trainer") as node,
    ):
        if rank < 2:  # rank = stage
            from peers.swarm.protocol import StageLimits
            from peers.swarm.server import StageServer, StageServerConfig

            module = build_stages(spec, 2, seed=SEED)[rank]
            opt = GradRecorder(module.parameters())
            limits = StageLimits(rank, 2, spec.n_embd, spec.vocab_size, spec.block_size, BATCH)
            server = StageServer(node, module, opt, NoneCompressor(), StageServerConfig(limits))
            report(q, "ready", rank, {"maddrs": node.visible_maddrs})
            deadline = time.monotonic() + 120
            while opt.grads is None and time.monotonic() < deadline:
                time.sleep(0.05)
            names = [n for n, _ in module.named_parameters()]
            grads = {n: tensor_bytes(g) for n, g in zip(names, opt.grads or [], strict=False)}
            report(q, "grads", rank, {"grads": grads, "served": server.served})
            time.sleep(600)  # stays up until the test tears the group down
        else:
            from peers.swarm.client import PipelineConfig, SwarmPipeline

            report(q, "ready", rank, {"maddrs": node.visible_maddrs})
            pipe = SwarmPipeline(
                node, PipelineConfig(2, spec.n_embd, spec.vocab_size, spec.block_size, BATCH)
            )
            pipe.wait_for_servers(60)
            x, y = _micro_batch()
            loss = pipe.train_microbatch(0, x, y)
            stats = pipe.tracker.stats
            report(
                q, "result", rank, {"loss": loss, "rerouted": stats.rerouted, "ledger": node.ledger.totals()}
            )


@pytest.mark.timeout(240)
def test_two_stage_pipeline_equals_single_process_model() -> None:
    from swarmtrain.app.models import GPT, GPTSpec

    with PeerGroup(_worker, n=3) as g:
        result = g.wait_for("result", 2, 120)
        grads = {r: g.wait_for("grads", r, 60)["grads"] for r in (0, 1)}
    assert g.orphans == []

    gpt = GPT(GPTSpec(**SPEC_ARGS), seed=SEED)
    x, y = _micro_batch()
    _, ref = gpt(x, y)
    assert ref is not None
    ref.backward()
    assert result["loss"] == pytest.approx(float(ref.detach()), rel=1e-6, abs=0)
    # a request may be rerouted once under load (seen once in a full-suite run at 1 reroute); the
    # loss above and the gradients below must be exact all the same (servers do not count a
    # micro-batch twice)
    assert result["rerouted"] <= 1
    got0 = {k: tensor_from_bytes(v) for k, v in grads[0].items()}
    got1 = {k: tensor_from_bytes(v) for k, v in grads[1].items()}
    ref_grads = {n: p.grad for n, p in gpt.named_parameters()}
    for j in range(2):  # stage 0 holds blocks 0-1, stage 1 blocks 2-3 (as block 0-1 of its own)
        for n, t in got0.items():
            if n.startswith(f"blocks.{j}."):
                torch.testing.assert_close(t, ref_grads[n], rtol=1e-5, atol=1e-7)
        for n, t in got1.items():
            if n.startswith(f"blocks.{j}."):
                torch.testing.assert_close(
                    t, ref_grads[n.replace(f"blocks.{j}.", f"blocks.{j + 2}.", 1)], rtol=1e-5, atol=1e-7
                )
    torch.testing.assert_close(got0["wpe.weight"], ref_grads["wpe.weight"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got1["ln_f.weight"], ref_grads["ln_f.weight"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(
        got0["wte.weight"] + got1["lm_head.weight"], ref_grads["wte.weight"], rtol=1e-5, atol=1e-7
    )
    assert len(got0) + len(got1) == len(ref_grads) + 1  # every parameter, the tied one on both sides
    by_kind = result["ledger"]["by_kind"]  # the trainer's ledger: hidden states out, gradients back
    hidden = BATCH * SPEC_ARGS["block_size"] * SPEC_ARGS["n_embd"] * 4
    assert by_kind["activations"]["sent"] > hidden  # tokens to stage 0, its output on to stage 1
    assert by_kind["activations"]["received"] > hidden  # stage 0's output
    assert by_kind["gradients"]["received"] > hidden  # stage 1's input gradient
    assert by_kind["gradients"]["sent"] > hidden  # stage 0's input again with that gradient
