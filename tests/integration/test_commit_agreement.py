"""Commit agreement: a member dies after it sent its aggregates to some members, before the have-all
exchange; every survivor must report the same ``committed`` flag (and keep identical parameters).

Without the agreement step (``peers.rounds.agreement``) the members that got the victim's aggregates commit
while the one it skipped fails: the split this test guards against.
"""

from __future__ import annotations

import hashlib
import os
import signal
from concurrent.futures import Future
from typing import Any

import pytest
import torch
from peer_helpers import Fp32Identity, PeerGroup, loopback_config, report, reporting_errors

N_PEERS = 4
VICTIM = 3
SKIPPED = 0  # the member the victim never sends its aggregates to
KILL_ROUND = 1


def worker(rank: int, initial: list[str], q: Any, n: int, max_rounds: int, skipped: str) -> None:
    import peers.rounds.collective as pc
    from peers import P2PCollective, PeerNode

    class Victim(P2PCollective):
        """Fault injection in a real peer: in an armed round, withhold aggregates from one member."""

        armed = False
        skipped = ""

        def _send(self, peer: str, env: Any, frames: list[Any], deadline: float) -> Future[None]:
            if self.armed and env.type == "agg" and peer == self.skipped:
                done: Future[None] = Future()
                done.set_result(None)
                return done
            return super()._send(peer, env, frames, deadline)

    real_agree = pc.agree

    def agree_or_die(io: Any) -> None:
        if coll.armed:  # aggregates sent and settled; no have goes out
            os.kill(os.getpid(), signal.SIGKILL)
        real_agree(io)

    pc.agree = agree_or_die  # type: ignore[assignment]
    with reporting_errors(q, rank), PeerNode(loopback_config("t-agree", initial)) as node:
        report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
        coll = Victim(node, min_peers=2, expected_peers=n, join_window=2.0)
        node.wait_for_peers(n, timeout=60)
        state = torch.arange(40_000, dtype=torch.float32) * (rank + 1)
        for r in range(max_rounds):
            if rank == VICTIM and r == KILL_ROUND:
                coll.armed = True
                coll.skipped = skipped
            res = coll.all_reduce({"x": state}, compressor=Fp32Identity(), timeout=15)
            if res.committed:
                state = res.tensors["x"]
            digest = hashlib.sha256(state.numpy().tobytes()).hexdigest()
            info = {"committed": res.committed, "participants": res.participants, "reason": res.reason}
            report(q, "round", rank, {**info, "digest": digest})


@pytest.mark.slow
def test_member_killed_before_have_all_survivors_agree() -> None:
    rounds = 3
    # rank 0 (the skipped member) starts first; the others are spawned with its peer ID
    g = PeerGroup(worker, N_PEERS, args=(N_PEERS, rounds, ""))
    g.spawn(0, [])
    try:
        first = g.wait_for("ready", 0, g.startup_timeout)
        g.ready[0] = first
        for r in range(1, N_PEERS):
            g.spawn(r, first["maddrs"], args=(N_PEERS, rounds, first["peer_id"]))
        for r in range(1, N_PEERS):
            g.ready[r] = g.wait_for("ready", r, g.startup_timeout)
        survivors = [r for r in range(N_PEERS) if r != VICTIM]
        hist = {r: [g.wait_for("round", r, 90) for _ in range(rounds)] for r in survivors}
        victim = g.procs[VICTIM]
        assert victim.join(10) and victim.exitcode == -signal.SIGKILL
    finally:
        g.stop()
    assert g.orphans == []
    for r in survivors:
        assert hist[r][0]["committed"] and len(hist[r][0]["participants"]) == N_PEERS, hist[r][0]
    flags = {r: hist[r][KILL_ROUND]["committed"] for r in survivors}
    reasons = [hist[r][KILL_ROUND]["reason"] for r in survivors]
    assert len(set(flags.values())) == 1, f"split commit: {flags}, reasons {reasons}"
    assert not flags[SKIPPED]  # it never got the victim's aggregates, so nobody may commit
    for r in survivors:
        later = hist[r][KILL_ROUND + 1]
        assert later["committed"], f"peer {r}: {later['reason']}"
        assert len(later["participants"]) == N_PEERS - 1
    for i in range(rounds):  # identical parameters on every survivor after every round
        assert len({hist[r][i]["digest"] for r in survivors}) == 1, i
