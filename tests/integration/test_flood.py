"""Resource limits against a flood (docs/architecture.md, "Budgets, not hopes"), with real processes on
127.0.0.1: three honest peers run all-reduce rounds while an intruder (a fourth peer of the same run
that never joins a round, ``swarmtrain.simulation.intruders``) attacks peer 0's collective handler:

1. a message trickled one byte a second, beside 20,000 zero-byte messages on another stream;
2. 4 MiB messages for the victim's next rounds (16 rounds x 4);
3. 24 streams that each announce a 16 MiB frame and never send it.

Without the defences (the code before them) this costs the victim about 640 MiB, the trickle holds
its stream past 40 s, the zero-byte messages are all stored and the stalled streams stay open. With
them: the victim's RSS grows by less than :data:`RSS_BOUND`, the trickle is cut within its
whole-message deadline, at most a pre-group allowance of zero-byte messages is taken, every stalled
stream is closed, and the honest peers commit their rounds.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from peer_helpers import PeerGroup, loopback_config, report, reporting_errors

N_HONEST = 3
ROUNDS = 32
WARM = 4  # rounds before the attack (the heap reaches its steady size)
NUMEL = 1_000_000
RSS_BOUND = 128 << 20  # the victim's RSS growth over its warm baseline, during and after the attack
RUN = "t-flood"
#: the trickled 4 KiB message's whole-message deadline (``peers.wire.framereader``: GRACE 10 s + 4 KiB at
#: MIN_RATE 64 KiB/s) plus the once-a-second check and scheduling slack
TRICKLE_DEADLINE = 15.0


def _victim_file(tmp: str) -> Path:
    return Path(tmp) / "victim.json"


def _sample_rss(stop: threading.Event, peak: list[int]) -> None:
    import psutil

    proc = psutil.Process()
    while not stop.is_set():
        peak[0] = max(peak[0], proc.memory_info().rss)
        time.sleep(0.05)


def honest(rank: int, initial: list[str], q: Any, tmp: str) -> None:
    import psutil
    import torch

    from compression import NoneCompressor
    from peers import P2PCollective, PeerNode

    with reporting_errors(q, rank), PeerNode(loopback_config(RUN, initial)) as node:
        report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
        coll = P2PCollective(node, min_peers=N_HONEST, expected_peers=N_HONEST, chunk_elems=1 << 18)
        node.wait_for_peers(N_HONEST, timeout=60)
        x = torch.randn(NUMEL, generator=torch.Generator().manual_seed(rank))
        committed: list[bool] = []
        stop, peak, baseline = threading.Event(), [0], 0
        sampler = threading.Thread(target=_sample_rss, args=(stop, peak), daemon=True)
        for i in range(ROUNDS):
            res = coll.all_reduce({"x": x.clone()}, compressor=NoneCompressor(), timeout=30)
            committed.append(res.committed)
            if rank == 0 and i == WARM - 1:
                baseline = peak[0] = psutil.Process().memory_info().rss
                sampler.start()
            if rank == 0:  # where the intruder aims: the next round, whose group is not formed yet
                tmp_file = _victim_file(tmp).with_suffix(".tmp")
                tmp_file.write_text(json.dumps({"peer": node.peer_id, "round": coll.round_id, "i": i}))
                os.replace(tmp_file, _victim_file(tmp))
            time.sleep(1.0)
        stop.set()
        final = psutil.Process().memory_info().rss
        report(
            q,
            "result",
            rank,
            {
                "committed": committed,
                "baseline": baseline,
                "peak": peak[0],
                "final": final,
                "trims": getattr(getattr(coll, "heap", None), "trims", -1),
                "buffered": coll._mailbox.buffered_bytes,
            },
        )
        time.sleep(5.0)  # stay up while the others finish their last round


def intruder(rank: int, initial: list[str], q: Any, tmp: str) -> None:
    from peers import PeerNode
    from swarmtrain.simulation import intruders as intr

    with reporting_errors(q, rank), PeerNode(loopback_config(RUN, initial)) as node:
        report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
        end = time.monotonic() + 120
        victim: dict[str, Any] = {}
        while time.monotonic() < end:
            try:
                victim = json.loads(_victim_file(tmp).read_text())
            except (OSError, ValueError):
                victim = {}
            if victim.get("i", -1) >= WARM - 1:
                break
            time.sleep(0.2)
        t = intr.Target(node.p2p, victim["peer"], RUN)

        def aim() -> int:
            return int(json.loads(_victim_file(tmp).read_text())["round"])

        async def first() -> list[dict[str, Any]]:
            import asyncio

            r = aim()
            return list(
                await asyncio.gather(
                    intr.trickle(t, r, 4096, 1.0, limit=40.0),
                    intr.zero_byte_flood(t, 20_000, r, timeout=40.0),
                )
            )

        out: dict[str, Any] = {}
        out["trickle"], out["zero"] = node.loop.run(first(), 90)
        r = aim()
        out["future"] = node.loop.run(intr.future_flood(t, range(r, r + 16), 4, 4 << 20, timeout=30.0), 60)
        out["stalled"] = node.loop.run(intr.stalled_streams(t, 24, aim(), hold=10.0), 60)
        report(q, "intruder", rank, out)
        time.sleep(60.0)  # the test stops this process


def worker(rank: int, initial: list[str], q: Any, tmp: str) -> None:
    (intruder if rank == N_HONEST else honest)(rank, initial, q, tmp)


@pytest.mark.slow  # 20-47 s: out of the quick loop
@pytest.mark.timeout(240)
def test_an_intruders_floods_cost_the_victim_little_and_the_run_goes_on(tmp_path: Path) -> None:
    with PeerGroup(worker, N_HONEST + 1, args=(str(tmp_path),)) as g:
        attack = g.wait_for("intruder", N_HONEST, 150)
        results = g.collect("result", 150, ranks=range(N_HONEST))
    assert g.orphans == []
    v = results[0]
    growth_peak, growth_final = v["peak"] - v["baseline"], v["final"] - v["baseline"]
    print(
        f"victim RSS {v['baseline'] >> 20} MiB warm, +{growth_peak >> 20} MiB peak, "
        f"+{growth_final >> 20} MiB after; heap trims {v['trims']}; attack {attack}; "
        f"committed {[sum(r['committed']) for r in results.values()]} of {ROUNDS}"
    )
    tr = attack["trickle"]
    assert tr["closed"] == 1.0 and tr["held_s"] < TRICKLE_DEADLINE, tr  # cut within its deadline
    assert attack["zero"]["accepted"] <= 64, attack["zero"]  # a pre-group allowance at most
    st = attack["stalled"]
    assert st["closed_by_victim"] == st["opened"] > 0, st
    assert attack["future"]["accepted"] <= 4 << 20, attack["future"]  # one message of allowance
    assert growth_peak < RSS_BOUND and growth_final < RSS_BOUND, (growth_peak, growth_final)
    for rank, r in results.items():
        assert sum(r["committed"]) >= ROUNDS - 2, (rank, r["committed"])
        assert all(r["committed"][-3:]), (rank, r["committed"])  # the run goes on after the attack


GONE_ROUND = 10**6  # far outside the victim's window: refused, yet read to keep the stream in step
DRAIN_MSG = 4 << 20
DRAIN_FLOOD_S = 8.0


def drain_worker(rank: int, initial: list[str], q: Any, tmp: str, defended: bool) -> None:
    """Rank 0: a peer whose collective handler is up (no rounds); rank 1: an admitted member that
    sends it 4 MiB messages for a round long gone for :data:`DRAIN_FLOOD_S` seconds."""
    from peers import P2PCollective, PeerNode
    from peers.rounds import inbound
    from swarmtrain.simulation import intruders as intr

    if rank == 0 and not defended:
        inbound.DRAIN_PER_MINUTE = 1 << 50  # the control: refused bodies read without a budget
    with reporting_errors(q, rank), PeerNode(loopback_config("t-drain", initial)) as node:
        if rank == 0:
            coll = P2PCollective(node)
            report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
            end = time.monotonic() + 120
            while not (Path(tmp) / "done").exists() and time.monotonic() < end:
                time.sleep(0.2)
            got = node.ledger.totals()["by_kind"].get("reduce", {}).get("received", 0)
            report(q, "result", rank, {"read": int(got), "refused": coll._inbound.drained.refused})
            time.sleep(30.0)  # the test stops this process
            return
        report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
        victim = initial[0].rsplit("/p2p/", 1)[1]
        t = intr.Target(node.p2p, victim, "t-drain")
        out = node.loop.run(intr.refused_flood(t, GONE_ROUND, DRAIN_MSG, DRAIN_FLOOD_S), DRAIN_FLOOD_S + 30)
        report(q, "attack", rank, out)
        time.sleep(30.0)


def _drain_run(tmp: Path, defended: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    folder = tmp / ("defended" if defended else "control")
    folder.mkdir()
    with PeerGroup(drain_worker, 2, args=(str(folder), defended)) as g:
        attack = g.wait_for("attack", 1, 90)
        (folder / "done").write_text("1")
        victim = g.wait_for("result", 0, 60)
    assert g.orphans == []
    return attack, victim


@pytest.mark.slow  # two runs of ~20 s
@pytest.mark.timeout(300)
def test_a_member_cannot_make_a_peer_read_refused_messages_without_bound(tmp_path: Path) -> None:
    """A member's messages for a round long gone are refused, and their bodies read (drained) so
    the stream stays in step: without a budget that reads whatever the member sends. With
    ``peers.rounds.inbound.DRAIN_PER_MINUTE`` the peer reads at most that much per minute, then
    closes the stream instead (the control: the same flood, unbounded)."""
    from peers.rounds.inbound import DRAIN_PER_MINUTE

    attack, victim = _drain_run(tmp_path, defended=True)
    c_attack, c_victim = _drain_run(tmp_path, defended=False)
    print(f"defended: attack {attack}, victim {victim}; control: attack {c_attack}, victim {c_victim}")
    assert victim["read"] <= DRAIN_PER_MINUTE + (1 << 20), victim  # headers and acks beside
    assert victim["refused"] > 0 and attack["streams"] > 1, (attack, victim)
    # the control read much more in the same time: the budget is what stops it
    assert c_victim["read"] > 2 * DRAIN_PER_MINUTE and c_victim["refused"] == 0, c_victim
