"""An outsider process writes DHT records to block every round; the run's signed, admitted records
keep it out (``peers.dht.dht_records``, ``peers.trust.admission``).

The outsider is a separate process with its own libp2p identity on the same DHT. It writes, for
every round ahead: group records for a fake leader "1" (members ``["1"]``) and fake joins for "1"
(unsigned: on the code before signed records, 0 of N rounds formed), plus joins and a one-member
group list signed with its *own* key; then it pushes joins and member lists (itself first) straight
to the honest peers' collective handlers and downloads the state they serve. Three honest peers
then all-reduce a few rounds.

* ``token`` policy (the honest peers hold join tokens from the run key, the outsider none): every
  round commits on every honest peer, with the honest peers only, and they end identical.
* ``open`` policy, the control: the outsider's signed records are admitted, it is counted as a
  joiner or followed as a leader, and rounds fail. This shows the admission check is what holds.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
from peer_helpers import LOOPBACK, Fp32Identity, PeerGroup, loopback_config, report, reporting_errors

RUN = "t-intruders"
HONEST = 3
ROUNDS = 4


def _outsider(initial: list[str], q: Any, rank: int) -> None:
    import hivemind
    from hivemind.utils import get_dht_time

    from peers import P2PCollective, PeerNode
    from peers.wire.messages import Envelope

    plain = hivemind.DHT(initial_peers=initial, host_maddrs=[LOOPBACK], start=True)  # unsigned records
    node = PeerNode(loopback_config(RUN, initial, admission="open"))  # signs with its own key
    report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
    exp = get_dht_time() + 600
    attempts = {"records": 0, "messages": 0}
    for r in range(ROUNDS + 4):
        key = f"{RUN}.reduce.{r}"
        for dht, who in ((plain, "1"), (node.dht, node.peer_id)):
            dht.store(f"{key}.join", b"1", exp, subkey=who)
            dht.store(f"{key}.group", msgpack.packb([who], use_bin_type=True), exp, subkey=who)
            attempts["records"] += 2
    # pushed joins and lists straight to the honest peers (found through their own DHT records)
    while len(honest := [p.peer_id for p in node.live_peers() if p.peer_id != node.peer_id]) < HONEST:
        time.sleep(0.2)
    coll = P2PCollective(node, min_peers=2)
    listed = msgpack.packb(sorted([node.peer_id, *honest]), use_bin_type=True)
    futs = []
    for r in range(2):  # the rounds an honest peer buffers before it starts them
        for h in honest:
            env = Envelope(type="join", run=RUN, kind="reduce", round=r)
            futs.append(coll._send(h, env, [], time.monotonic() + 10))
            grp = Envelope(type="grp", run=RUN, kind="reduce", round=r, frames=1, nbytes=len(listed))
            futs.append(coll._send(h, grp, [listed], time.monotonic() + 10))
    from peers.state.state_transfer import download_state

    try:  # the state the honest peers announce (their announcements are readable: signed, not secret)
        download_state(node, timeout=30, wait_for_donor=20)
        state_downloaded = True
    except Exception:
        state_downloaded = False
    accepted = 0
    for f in futs:
        attempts["messages"] += 1
        try:
            f.result(15)
            accepted += 1
        except Exception:
            pass  # refused: what admission is for
    report(
        q, "attacked", rank, {"attempts": attempts, "accepted_messages": accepted, "state": state_downloaded}
    )
    while True:  # stay on the DHT (serving its records) until the test stops the group
        time.sleep(1.0)


def worker(rank: int, initial: list[str], q: Any, creds: list[dict[str, str]], policy: str) -> None:
    if rank == HONEST:
        with reporting_errors(q, rank):
            _outsider(initial, q, rank)
        return
    from peers import P2PCollective, PeerNode
    from peers.state.state_transfer import StateServer

    c = creds[rank]
    extra = {"identity_path": c["identity"], "admission": policy}
    if policy == "token":
        extra.update(run_public_key=c["run_public"], token=c["token"])
    with reporting_errors(q, rank), PeerNode(loopback_config(RUN, initial, **extra)) as node:
        report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
        server = StateServer(node, lambda: ({"w": torch.zeros(1000)}, {"round": 0}))
        server.refresh()  # a donor: what a newcomer (or the outsider) downloads
        coll = P2PCollective(node, min_peers=2, expected_peers=HONEST, join_window=3.0)
        node.wait_for_peers(HONEST, timeout=60)
        go = Path(c["go"])  # the test creates it once the outsider's attack is out
        while not go.exists():
            time.sleep(0.1)
        state = torch.full((10_000,), float(rank))
        for _ in range(ROUNDS):
            res = coll.all_reduce({"x": state}, compressor=Fp32Identity(), timeout=15)
            if res.committed:
                state = res.tensors["x"]
            report(
                q,
                "round",
                rank,
                {
                    "committed": res.committed,
                    "members": list(res.participants),
                    "reason": res.reason,
                    "digest": hashlib.sha256(state.numpy().tobytes()).hexdigest(),
                },
            )


def _credentials(tmp: Path) -> list[dict[str, str]]:
    from peers.keys.identity import ensure_identity
    from peers.trust.admission import RunKey, encode_token_text

    key = RunKey.generate(tmp / "run.key")
    out = []
    for r in range(HONEST):
        ident = tmp / f"id{r}.key"
        peer_id = ensure_identity(ident)
        token = encode_token_text(key.issue(RUN, peer_id, time.time() + 3600))
        out.append(
            {"identity": str(ident), "run_public": key.public_hex, "token": token, "go": str(tmp / "go")}
        )
    return out


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["token", "open"])
def test_an_outsiders_records_cannot_block_the_rounds(policy: str, tmp_path: Path) -> None:
    creds = _credentials(tmp_path)
    with PeerGroup(worker, HONEST + 1, args=(creds, policy)) as g:
        attack = g.wait_for("attacked", HONEST, 90)
        assert attack["attempts"]["records"] > 0 and attack["attempts"]["messages"] > 0
        (tmp_path / "go").touch()
        hist = {r: [g.wait_for("round", r, 90) for _ in range(ROUNDS)] for r in range(HONEST)}
    assert g.orphans == []
    outsider = g.ready[HONEST]["peer_id"]
    honest_ids = sorted(g.ready[r]["peer_id"] for r in range(HONEST))
    if policy == "open":  # the control: without admission the outsider's records break rounds
        failed = [h["reason"] for r in hist for h in hist[r] if not h["committed"]]
        assert failed, "the outsider's admitted records should have broken a round under 'open'"
        assert attack["accepted_messages"] > 0 and attack["state"]
        return
    assert attack["accepted_messages"] == 0  # every stream of the outsider's was refused
    assert not attack["state"]  # the state servers refused it too
    for r, rounds in hist.items():
        for h in rounds:
            assert h["committed"], f"peer {r}: {h['reason']}"
            assert h["members"] == honest_ids and outsider not in h["members"]
    for i in range(ROUNDS):
        assert len({hist[r][i]["digest"] for r in range(HONEST)}) == 1
