"""Issue 30 finding 1 with real peers: two colluding donors a round ahead, vouching for each other's
forged state and signing it as a group of two, plant nothing once the run has commit certificates
(``peers.state.certificates``); with the certificate rule off in the newcomer (the vouching rules
alone, the control) the same two plant their state."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest
import torch
from peer_helpers import PeerGroup, loopback_config, report, reporting_errors

TTL = 60.0
HONEST, FORGED = torch.full((1000,), 5.0), torch.full((1000,), 0.0123)
#: ranks 0-2 and 3-4; rank 5 is the newcomer. Colluders must be fewer than half of the established
#: peers: two of four look exactly like two peers that committed a round while the others were frozen
#: (``peers.state.certificates``), whose round is taken
HONEST_DONORS, COLLUDERS = 3, 2


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def worker(rank: int, initial: list[str], q: Any) -> None:
    """Ranks 0-4 all committed round 5 (a group of five) and sign it. Ranks 3-4 then announce round 6
    (within the round bound), vouch for each other's forged state and sign it as a group of two.
    Rank 5, the newcomer, downloads with the certificates, then with them off (the control)."""
    from peers import PeerNode, StateServer, download_state
    from peers.dht.process import GracefulExit
    from peers.state import donors
    from peers.state.certificates import read_certificates
    from swarmtrain.core.errors import ProtocolError

    with (
        reporting_errors(q, rank),
        GracefulExit() as stop,
        PeerNode(loopback_config("t-cert", initial), heartbeat_ttl=TTL) as node,
    ):
        if rank < HONEST_DONORS + COLLUDERS:
            state = {"w": HONEST, "round": 5}
            server = StateServer(node, lambda: ({"w": state["w"]}, {"round": state["round"]}))
            server.refresh(vouch=_digest(HONEST), committed_by=HONEST_DONORS + COLLUDERS)
            if rank >= HONEST_DONORS:  # a colluder: its own round of two, ahead of the others
                state.update(w=FORGED, round=6)
                server.refresh(vouch=_digest(FORGED), committed_by=COLLUDERS)
            node.publish(round=state["round"])
            report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
            stop.wait(150)
            server.close()
            return
        report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
        start = time.monotonic()
        donors_n = HONEST_DONORS + COLLUDERS
        while len([p for p in node.live_peers() if p.round > 0]) < donors_n:  # every record is in
            time.sleep(0.2)
        while len({c.signer for c in read_certificates(node, "t-cert", 10.0)}) < donors_n:
            time.sleep(0.2)

        def check(tensors: dict[str, torch.Tensor], meta: dict[str, Any], vouched: bytes | None) -> None:
            if vouched is not None and _digest(tensors["w"]) != vouched.hex():
                raise ProtocolError("not the state the donors vouched for")

        waited, start = time.monotonic() - start, time.monotonic()
        tensors, meta = download_state(node, timeout=60, vouchers=2, check=check)
        donors.certified_states = lambda *a: None  # the control: the certificate rule off
        t0, m0 = download_state(node, timeout=60, vouchers=2, check=check)
        got = {
            "certified": (meta["round"], float(tensors["w"][0])),
            "vouched": (m0["round"], float(t0["w"][0])),
        }
        report(q, "result", rank, {**got, "waited_s": waited, "download_s": time.monotonic() - start})


@pytest.mark.slow
def test_two_colluders_a_round_ahead_plant_nothing_against_the_certified_history() -> None:
    n = HONEST_DONORS + COLLUDERS
    with PeerGroup(worker, n) as g:
        g.spawn(n, g.bootstrap_maddrs)
        g.ready[n] = g.wait_for("ready", n, 90)
        res = g.wait_for("result", n, 180)
    print("newcomer:", {k: round(v, 1) for k, v in res.items() if k.endswith("_s")})
    assert g.orphans == []
    assert res["certified"] == (5, 5.0)  # the state the five members signed
    assert res["vouched"] == (6, pytest.approx(0.0123))  # the control: the colluders' round 6
