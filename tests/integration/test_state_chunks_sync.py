"""Chunked state sync between real peer processes on 127.0.0.1 (issue 14, point 4).

Three donors serve the same state (one round's, as peers that committed it do) at a capped upload
rate, in 64 KiB chunks; a newcomer pulls it with ``download_state`` and reports its
``ChunkProgress``. (a) the chunks come from more than one donor and the state is identical;
(b) a donor SIGKILLed mid-download: the others finish it, and no chunk verified before the kill is
fetched again; (c) a lying donor serves chunks with flipped bytes: each is rejected, the liar dropped,
the chunk fetched from an honest donor, and the state is still identical.
"""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from typing import Any

import pytest
import torch
from peer_helpers import PeerGroup, loopback_config, report, reporting_errors

DONORS = 3
CHUNK = 64 << 10
RATE = 384 << 10  # bytes/s per donor: a ~3 MiB state takes seconds, time enough to kill one mid-way
RUN = "t-chunks"


def donor_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    g = torch.Generator().manual_seed(7)
    tensors = {
        "model.w": torch.randn(700, 1100, generator=g),  # ~2.9 MiB: ~47 chunks
        "model.b": torch.randn(33, generator=g).to(torch.bfloat16),
        "step": torch.tensor([50], dtype=torch.int64),
    }
    return tensors, {"round": 5, "strategy": "diloco"}


def digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        h.update(f"{k}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def worker(rank: int, initial: list[str], q: Any, scenario: str) -> None:
    from peers import PeerNode, StateServer
    from peers.dht.process import GracefulExit

    with (
        reporting_errors(q, rank),
        GracefulExit() as stop,
        PeerNode(loopback_config(RUN, initial), heartbeat_ttl=60.0) as node,
    ):
        if rank < DONORS:
            server = StateServer(node, donor_state, upload_rate=RATE, chunk_bytes=CHUNK)
            if scenario == "liar" and rank == DONORS - 1:  # serves the honest manifest, flipped chunks
                honest = server.chunks.chunk

                def flipped(h: bytes) -> bytes | None:
                    data = honest(h)
                    return None if data is None else bytes(b ^ 0xFF for b in data[:64]) + data[64:]

                server.chunks.chunk = flipped  # type: ignore[method-assign]
            server.refresh()
            report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
            stop.wait(180)
            server.close()
            return
        report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
        _download(node, q, rank, scenario)


def _download(node: Any, q: Any, rank: int, scenario: str) -> None:
    from peers.state.donors import announcements
    from peers.state.state_chunks import ChunkProgress
    from peers.state.state_transfer import download_state

    deadline = time.monotonic() + 60
    while len(announcements(node, RUN, 15.0)) < DONORS and time.monotonic() < deadline:
        time.sleep(0.2)  # every donor announced: the download can pull from all of them
    progress = ChunkProgress()
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["state"] = download_state(node, timeout=120, wait_for_donor=30, progress=progress)
        except Exception as e:  # reported, the test fails on it
            out["error"] = f"{type(e).__name__}: {e}"

    t = threading.Thread(target=run, daemon=True)
    t.start()
    before: list[tuple[int, str]] | None = None
    while t.is_alive():
        t.join(0.02)
        if scenario == "kill" and before is None:
            busiest = max(progress.by_donor.items(), key=lambda kv: kv[1], default=("", 0))
            if busiest[1] >= 4:  # a donor served a few chunks: the test kills it now
                before = list(progress.log)
                report(q, "kill", rank, {"victim": busiest[0], "log": before})
    if "error" in out:
        raise RuntimeError(out["error"])
    tensors, meta = out["state"]
    report(
        q,
        "result",
        rank,
        {
            "digest": digest(tensors),
            "donor": meta["donor"],
            "by_donor": dict(progress.by_donor),
            "rejected": dict(progress.rejected),
            "dropped": sorted(progress.dropped),
            "fetches": sorted(progress.fetches.values()),
            "log": list(progress.log),
            "chunks": len(progress.store),
            "state_bytes": node.ledger.totals()["by_kind"]["state"]["received"],
        },
    )


def _run(scenario: str) -> tuple[PeerGroup, dict[str, Any], dict[str, Any] | None]:
    with PeerGroup(worker, DONORS, args=(scenario,)) as g:
        g.spawn(DONORS, g.bootstrap_maddrs)
        g.ready[DONORS] = g.wait_for("ready", DONORS, 90)
        kill = None
        if scenario == "kill":
            kill = g.wait_for("kill", DONORS, 90)
            victim = next(r for r in range(DONORS) if g.ready[r]["peer_id"] == kill["victim"])
            g.procs[victim].signal(signal.SIGKILL)
        res = g.wait_for("result", DONORS, 150)
    return g, res, kill


def _expected() -> tuple[str, int]:
    from peers.state.state_transfer import serialize_state

    tensors, meta = donor_state()
    n = len(serialize_state(tensors, meta))
    return digest(tensors), n


def test_download_pulls_chunks_from_several_donors_and_ends_with_the_identical_state() -> None:
    g, res, _ = _run("plain")
    want, nbytes = _expected()
    assert res["digest"] == want
    donors = {g.ready[r]["peer_id"] for r in range(DONORS)}
    assert set(res["by_donor"]) <= donors
    assert len([d for d, n in res["by_donor"].items() if n > 0]) >= 2, f"one donor only: {res['by_donor']}"
    assert sum(res["by_donor"].values()) == res["chunks"] > 40
    assert set(res["fetches"]) == {1}, "a chunk was fetched twice"
    assert res["rejected"] == {} and res["state_bytes"] >= nbytes


def test_a_donor_killed_mid_download_the_others_finish_it_without_refetching() -> None:
    g, res, kill = _run("kill")
    assert kill is not None
    want, _ = _expected()
    assert res["digest"] == want
    victim = kill["victim"]
    assert victim in res["dropped"], "the download was over before the kill: no mid-download death"
    assert set(res["fetches"]) == {1}, "chunks fetched before the kill were fetched again"
    before = {tuple(x) for x in kill["log"]}
    assert before <= {tuple(x) for x in res["log"]}, "verified chunks were lost"
    served_before = [i for i, d in kill["log"] if d == victim]
    assert served_before and all(d == victim for i, d in res["log"] if i in served_before)
    others = {d: n for d, n in res["by_donor"].items() if d != victim}
    assert sum(others.values()) > 0 and sum(res["by_donor"].values()) == res["chunks"]


@pytest.mark.slow  # 20-47 s: out of the quick loop
def test_a_lying_donors_chunks_are_rejected_and_fetched_from_honest_donors() -> None:
    g, res, _ = _run("liar")
    want, _ = _expected()
    liar = g.ready[DONORS - 1]["peer_id"]
    assert res["digest"] == want
    assert res["rejected"].get(liar, 0) >= 1, "the liar's tampered chunks were not rejected"
    assert liar in res["dropped"] and res["by_donor"].get(liar, 0) == 0
    assert set(res["fetches"]) == {1} and sum(res["by_donor"].values()) == res["chunks"]
