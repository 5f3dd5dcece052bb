"""Replicas of a SWARM stage: a server joining a stage takes the parameters its replicas vouch for.

Real processes on 127.0.0.1: a server of stage 0 and one of stage 1 train on 3 micro-batches from a
trainer (AdamW, so stage 0's parameters move away from the initial ones); each server averages with
its stage (alone here) every second and then serves the averaged state, vouching for its digest. A
second server of stage 0 then starts from the *initial* parameters, downloads the stage's state
(hash-checked against the vouched digest) and ends up with exactly the first server's parameters.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from peer_helpers import PeerGroup, loopback_config, report, reporting_errors

SPEC_ARGS = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 256}
BATCH = 2


def _worker(rank: int, initial: list[str], q: Any) -> None:
    from compression import NoneCompressor
    from peers.dht.node import PeerNode
    from peers.swarm.replicas import ReplicaSync, params_digest
    from swarmtrain.app.models import GPTSpec
    from swarmtrain.app.models.stages import build_stages

    torch.set_num_threads(1)
    spec = GPTSpec(**SPEC_ARGS)
    role = "trainer" if rank == 2 else "server"
    with reporting_errors(q, rank), PeerNode(loopback_config("swarm-rep", initial), role=role) as node:
        if rank == 2:
            from peers.swarm.client import PipelineConfig, SwarmPipeline

            report(q, "ready", rank, {"maddrs": node.visible_maddrs})
            pipe = SwarmPipeline(
                node, PipelineConfig(2, spec.n_embd, spec.vocab_size, spec.block_size, BATCH)
            )
            pipe.wait_for_servers(60)
            g = torch.Generator().manual_seed(3)
            for i in range(3):
                xy = torch.randint(0, 256, (BATCH, spec.block_size + 1), generator=g)
                pipe.train_microbatch(i, xy[:, :-1], xy[:, 1:])
            report(q, "result", rank, None)
            time.sleep(600)
        stage = 1 if rank == 1 else 0
        module = build_stages(spec, 2, seed=1)[stage]
        params = dict(module.named_parameters())
        initial_digest = params_digest(params).hex()
        sync = ReplicaSync(node, stage, params, NoneCompressor(), period=1.0)
        adopted = sync.adopt(timeout=60) if rank == 3 else None
        if rank == 3:
            report(q, "ready", rank, {"maddrs": node.visible_maddrs})
            report(
                q,
                "adopted",
                rank,
                {"ok": adopted, "digest": params_digest(params).hex(), "init": initial_digest},
            )
            time.sleep(600)
        from peers.swarm.protocol import StageLimits
        from peers.swarm.server import StageServer, StageServerConfig

        limits = StageLimits(stage, 2, spec.n_embd, spec.vocab_size, spec.block_size, BATCH)
        opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
        server = StageServer(
            node, module, opt, NoneCompressor(), StageServerConfig(limits), between_requests=sync.maybe_sync
        )
        report(q, "ready", rank, {"maddrs": node.visible_maddrs})
        while server.version < 3:
            time.sleep(0.05)
        committed = sync.committed
        while sync.committed < committed + 2:  # two averages after the last step: the state is served
            time.sleep(0.1)
        report(q, "trained", rank, {"digest": params_digest(params).hex(), "init": initial_digest})
        time.sleep(600)


@pytest.mark.timeout(240)
def test_new_server_adopts_the_stage_state_of_its_replicas() -> None:
    with PeerGroup(_worker, n=3) as g:
        g.wait_for("result", 2, 120)
        donor = g.wait_for("trained", 0, 60)
        g.spawn(3, g.bootstrap_maddrs)
        got = g.wait_for("adopted", 3, 120)
    assert g.orphans == []
    assert donor["digest"] != donor["init"]  # the donor's stage trained
    assert got["init"] == donor["init"]  # the newcomer started from the same initial parameters
    assert got["ok"] is True
    assert got["digest"] == donor["digest"]  # and now holds exactly the donor's
