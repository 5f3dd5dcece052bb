"""A volunteer's contribution (issue 31.6): the tokens of its own steps in the rounds it committed and
those rounds, in its peer record (untrusted input: bounded like the other counts), in ``join``'s end
line, in ``status``'s table and in the dashboard's per-volunteer table (restarts summed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest

from peers.dht.records import PeerRecord, decode_record, encode_record
from swarmtrain.app.commands.join import end_line
from swarmtrain.app.commands.peers import peer_table
from swarmtrain.app.dashboard import DashboardServer, History
from swarmtrain.app.units import short_count

A, B, BOOT = (
    "12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "12D3KooWBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
    "12D3KooWCccccccccccccccccccccccccccccccccccccccccccc",
)


def _rec(peer: str = A, tokens: int = 0, rounds: int = 0, **kw: Any) -> PeerRecord:
    base: dict[str, Any] = {"peer_id": peer, "run_id": "r", "time": 100.0, "version": "0.1.0"}
    base["extra"] = {"committed": rounds, "late": 0, "failed": 0}
    return PeerRecord(**{**base, "contributed_tokens": tokens, "committed_rounds": rounds, **kw})


def test_the_record_carries_the_contribution_and_refuses_out_of_bounds_counts() -> None:
    rec = _rec(tokens=81_920, rounds=4, step=20, round=4, loss=2.5)
    assert decode_record(encode_record(rec)) == rec
    good = msgpack.unpackb(encode_record(rec))
    for field in ("contributed_tokens", "committed_rounds"):
        for bad in (-1, 1 << 62, True, 1.5, "81920", None):
            with pytest.raises(Exception, match=f"field {field} invalid"):
                decode_record(msgpack.packb({**good, field: bad}, use_bin_type=True))
    top = msgpack.packb({**good, "contributed_tokens": (1 << 62) - 1}, use_bin_type=True)
    assert decode_record(top).contributed_tokens == (1 << 62) - 1
    older = {k: v for k, v in good.items() if k not in ("contributed_tokens", "committed_rounds")}
    old = decode_record(msgpack.packb(older, use_bin_type=True))  # a peer before issue 31.6
    assert (old.contributed_tokens, old.committed_rounds) == (0, 0)


def test_short_counts_fit_six_characters() -> None:
    cases = {0: "0", 999: "999", 1000: "1k", 81_920: "81.9k", 999_999: "1M", 1_234_567: "1.23M"}
    for n, text in cases.items():
        assert short_count(n) == text, n
    assert short_count(123_456_789_012) == "123G" and short_count((1 << 62) - 1) == "4.61E"
    assert all(len(short_count(10**k - 1)) <= 6 for k in range(1, 19))


def test_joins_end_line_says_what_the_volunteer_contributed_in_80_columns() -> None:
    result = SimpleNamespace(
        steps=123_456,
        committed_rounds=4_115,
        contributed_tokens=1_011_351_552,
        final_val_loss=3.25,
        bytes_sent=5 * 2**30,
        bytes_received=6 * 2**30,
    )
    lines = end_line("stopped by signal", result).splitlines()
    assert lines == [
        "stopped by signal: 123456 steps, 4115 rounds committed, 1.01G tokens contributed",
        "val loss 3.2500, sent 5.0 GiB, received 6.0 GiB",
    ]
    assert all(len(x) <= 80 for x in lines)


def test_status_shows_each_volunteers_tokens_next_to_its_rounds() -> None:
    recs = [
        _rec(A, tokens=81_920, rounds=4, step=20, round=4, bytes_sent=3 * 2**20),
        _rec(B, tokens=61_440, rounds=3, step=20, round=4),
        PeerRecord(peer_id=BOOT, run_id="r", role="bootstrap", version="0.1.0", time=100.0),
    ]
    lines = peer_table("r", recs, width=80)
    assert all(len(x) <= 80 for x in lines), lines
    head = lines[1].split()
    assert head[-2:] == ["ok/late/fail", "tokens"] and "sent" in head and "recv" in head, lines
    rows = {x.split()[0]: x.split() for x in lines[2:5]}
    assert rows[A[-8:]][-2:] == ["4/0/0", "81.9k"] and rows[B[-8:]][-2:] == ["3/0/0", "61.4k"]
    assert rows[BOOT[-8:]][-2:] == ["-", "-"]  # a bootstrap trains nothing: no figure, not 0


def test_the_dashboard_sums_a_volunteers_restarts_and_keeps_those_that_left() -> None:
    h = History("r")
    h.update([_rec(A, 10_000, 2), _rec(B, 5_000, 1)], {}, 1.0)
    h.update([_rec(A, 20_000, 4), _rec(B, 5_000, 1)], {}, 2.0)
    h.update([_rec(A, 0, 0)], {}, 3.0)  # A restarted (same identity): its counters start again; B left
    h.update([_rec(A, 4_000, 1)], {}, 4.0)
    rows = h.snapshot(5.0)["contributions"]
    assert [(r["peer"], r["tokens"], r["rounds"], r["live"]) for r in rows] == [
        (A, 24_000, 5, True),
        (B, 5_000, 1, False),
    ]
    assert [round(r["share"], 3) for r in rows] == [0.828, 0.172]
    assert rows[1]["last_seen"] == 2.0 and rows[0]["first_seen"] == 1.0
    boot = PeerRecord(peer_id=BOOT, run_id="r", role="bootstrap")
    h.update([boot, _rec(A, 4_000, 1)], {}, 6.0)
    assert BOOT not in {r["peer"] for r in h.contributions()}  # only peers that train contribute


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_the_dashboard_page_draws_the_contribution_table(tmp_path: Path) -> None:
    """Headless Chromium renders the page over canned records: one row per volunteer, biggest first,
    with its tokens and rounds (and the one that left)."""
    h = History("r")
    h.update([_rec(A, 61_440, 3), _rec(B, 81_920, 4)], {}, 1.0)
    h.update([_rec(A, 61_440, 3)], {}, 2.0)
    srv = DashboardServer("127.0.0.1", 0, lambda: h.snapshot(3.0))
    srv.start()
    try:
        argv = [
            str(shutil.which("chromium")),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=3000",
            "--dump-dom",
            srv.url,
        ]
        dom = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path).stdout
    finally:
        srv.close()
    table = re.search(r'<table id="contributions">.*?</table>', dom, re.DOTALL)
    assert table, dom[-2000:]
    rows = re.findall(r'<tr data-peer="(\w+)" data-tokens="(\d+)" data-rounds="(\d+)">(.*?)</tr>', table[0])
    assert [r[:3] for r in rows] == [(B, "81920", "4"), (A, "61440", "3")], table[0]
    cells = [re.findall(r"<td[^>]*>(?:<i[^>]*></i>)?([^<]*)</td>", r[3]) for r in rows]
    assert cells[0][1:5] == ["left", "82k", "57.1 %", "4"], cells
    assert cells[1][1:5] == ["live", "61k", "42.9 %", "3"], cells


class _Node:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []
        self.ledger = SimpleNamespace(sent=0, received=0)

    def publish(self, **fields: Any) -> None:
        self.published.append(fields)


def _peer(monkeypatch: pytest.MonkeyPatch, node: _Node) -> Any:
    """A volunteer's ``_Peer`` with stubs for what ``on_step`` touches at a sync (no network, no model):
    its rounds commit or go on without it, and a catch-up adopts a donor's state."""
    from swarmtrain.app.peer import loop as loop_mod
    from swarmtrain.app.peer.contract import PeerHooks, PeerRun, SyncClock
    from swarmtrain.app.peer.realign import Realign

    monkeypatch.setattr(loop_mod, "shared_digest", lambda trainer: "ab" * 32)
    monkeypatch.setattr(loop_mod, "fast_forward", lambda trainer, steps: 0)
    monkeypatch.setattr(loop_mod, "steps_behind", lambda *a, **k: 0)
    adopted = (("donor", 0.0, None), 0, 0)
    monkeypatch.setattr(loop_mod, "adopt_swarm_state", lambda *a, **k: adopted)
    peer = object.__new__(loop_mod._Peer)
    peer.node, peer.result, peer.watch, peer.hooks = node, PeerRun(peer_id="me"), None, PeerHooks()
    peer.trainer = SimpleNamespace(step=0, tokens_per_step=100)
    peer.p2p = SimpleNamespace(round_id=0, deadlines=SimpleNamespace(join_window=lambda: 1.0))
    peer.cfg = SimpleNamespace(
        train=SimpleNamespace(log_interval=1000), peers=SimpleNamespace(round_timeout=5.0)
    )
    peer.membership = SimpleNamespace(catch_up_timeout=5.0, catch_up_after_failure=True)
    peer.stop = SimpleNamespace(requested=False)
    peer.own_admission = SimpleNamespace(check=lambda: None)
    peer.streak = SimpleNamespace(committed=lambda: None, failed=lambda reason: None)
    peer.server = SimpleNamespace(refresh=lambda vouch=None, committed_by=0: None)
    peer.saved_path, peer._realign, peer._vouch = None, Realign(5), None
    peer._clock, peer._published, peer._last_status, peer._step_t, peer._sync_s = (
        SyncClock(5),
        0.0,
        0.0,
        0.0,
        0.0,
    )
    peer._steps_per_s, peer._state_age, peer._in_step, peer._peers_seen = 0.0, 0.0, False, 1
    peer._pending_tokens = 0
    return peer


def _sync(peer: Any, outcome: str, round_id: int) -> None:
    """Five steps of 100 tokens, the fifth a sync that ends with ``outcome``."""
    for _ in range(5):
        peer.trainer.step += 1
        last = peer.trainer.step % 5 == 0
        report = SimpleNamespace(
            synced=last,
            committed=last and outcome == "committed",
            late=last and outcome == "late",
            round_id=round_id if outcome == "committed" else -1,
            participants=2,
            bytes_sent=0,
            reason="",
            extra={},
        )
        peer.on_step(SimpleNamespace(step=peer.trainer.step, report=report, tokens_per_s=200.0, loss=3.0))
        if last and outcome == "committed":
            peer.p2p.round_id = round_id + 1


def test_a_commit_counts_the_steps_since_the_last_one_and_a_download_drops_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = _Node()
    peer = _peer(monkeypatch, node)
    _sync(peer, "committed", 0)
    assert (peer.result.contributed_tokens, peer.result.committed_rounds) == (500, 1)
    assert node.published[-1]["contributed_tokens"] == 500 and node.published[-1]["committed_rounds"] == 1
    _sync(peer, "late", -1)  # the round went on without it: it adopts the others' state, its 5 steps go
    assert peer.result.contributed_tokens == 500 and peer._pending_tokens == 0
    assert peer.result.downloads, "the late round's catch-up did not run"
    _sync(peer, "committed", 2)
    assert (peer.result.contributed_tokens, peer.result.committed_rounds) == (1000, 2)
    assert node.published[-1]["contributed_tokens"] == 1000
