"""The dashboard's history, poller and web server without a network: canned peer records in, JSON out."""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest

from peers.dht.records import PeerRecord
from swarmtrain.app.cli import run as cli_run
from swarmtrain.app.dashboard import DashboardServer, History, Poller
from swarmtrain.app.dashboard.history import step_ticks
from swarmtrain.app.dashboard.page import PAGE
from swarmtrain.core.jsonsafe import dumps

A, B = (
    "12D3KooWAaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "12D3KooWBbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
)


def rec(peer: str = A, step: int = 0, rnd: int = 0, loss: float = float("nan"), **kw: Any) -> PeerRecord:
    extra: dict[str, float | int | str] = {
        k: kw.pop(k) for k in ("committed", "late", "failed", "outcome") if k in kw
    }
    return PeerRecord(
        peer_id=peer, run_id="r", step=step, round=rnd, loss=loss, time=100.0, extra=extra, **kw
    )


def strict(text: str) -> Any:
    """Parse JSON the way a browser does: NaN/Infinity are errors."""

    def no_constants(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=no_constants)


def test_a_point_per_change_of_step_round_or_loss_and_nan_is_null() -> None:
    h = History("r")
    h.update([rec(step=0)], {}, 1.0)
    h.update([rec(step=0)], {}, 2.0)  # nothing moved (NaN == NaN here): no new point
    h.update([rec(step=10, rnd=1, loss=3.0)], {}, 3.0)
    h.update([rec(step=10, rnd=1, loss=3.0, bytes_sent=5)], {}, 4.0)  # only bytes: no new point
    h.update([rec(step=20, rnd=2, loss=2.5, throughput=7.0)], {}, 5.0)
    snap = strict(dumps(h.snapshot(6.0)))
    pts = snap["series"][A]["points"]
    assert [p[:4] for p in pts] == [[1.0, 0, 0, None], [3.0, 10, 1, 3.0], [5.0, 20, 2, 2.5]]
    assert pts[-1][6] == 7.0 and snap["series"][A]["live"] is True
    assert snap["polls"] == 5 and snap["updated"] == 5.0 and snap["error"] is None
    row = snap["peers"][0]
    assert row["peer"] == A and row["loss"] == 2.5 and row["seen_ago"] == 0.0
    assert [p[1] for p in snap["throughput"]] == [0.0, 0.0, 0.0, 0.0, 7.0]


def test_the_loss_curve_has_a_point_per_published_step_within_a_round_on_a_whole_step_axis() -> None:
    h = History("r")
    for i, step in enumerate(range(30, 32)):  # two steps of one round: the axis read 30 30 30 31 31 31
        h.update([rec(step=step, rnd=3, loss=3.0 - step / 100)], {}, float(i))
    snap = h.snapshot(5.0)
    assert [p[1] for p in snap["series"][A]["points"]] == [30, 31]  # not one point per round
    assert snap["step_ticks"] == [30, 31]
    for lo, hi in [(0, 1000), (30, 30), (7, 93), (0, 5), (123_456, 123_999)]:
        ticks = step_ticks(lo, hi)
        assert ticks and all(isinstance(t, int) for t in ticks), (lo, hi, ticks)
        assert len(set(ticks)) == len(ticks) and ticks == sorted(ticks) and len(ticks) <= 12
        assert lo <= ticks[0] and ticks[-1] <= hi, (lo, hi, ticks)
    assert step_ticks(0, 1000) == [0, 200, 400, 600, 800, 1000]
    assert History("r").snapshot(1.0)["step_ticks"] == []


def test_history_is_bounded() -> None:
    h = History("r", max_points=5, max_peers=2)
    for i in range(20):
        h.update([rec(step=i, rnd=i, loss=1.0 / (i + 1), bytes_sent=100 * i, committed=i)], {}, float(i))
    snap = h.snapshot(20.0)
    assert len(snap["series"][A]["points"]) == 5 and snap["series"][A]["points"][-1][1] == 19
    assert len(snap["rounds"]) == 5 and snap["rounds"][-1]["round"] == 19
    assert len(snap["timeline"]) == 5 and len(snap["throughput"]) == 5
    peers = [f"12D3KooWPeer{i:040d}" for i in range(4)]
    for i, p in enumerate(peers):  # one live peer at a time: the ones gone longest are forgotten
        h.update([rec(peer=p, step=1, loss=1.0)], {}, 30.0 + i)
    assert set(h.snapshot(40.0)["series"]) == set(peers[-2:])


def test_bytes_per_round_are_the_ledger_growth_between_polls() -> None:
    h = History("r")
    h.update([rec(A, rnd=1, bytes_sent=1000, bytes_received=900), rec(B, rnd=1, bytes_sent=10)], {}, 1.0)
    h.update([rec(A, rnd=2, bytes_sent=1600, bytes_received=1300), rec(B, rnd=2, bytes_sent=70)], {}, 2.0)
    h.update([rec(A, rnd=3, bytes_sent=1700, bytes_received=1400), rec(B, rnd=2, bytes_sent=70)], {}, 3.0)
    h.update([rec(A, rnd=4, bytes_sent=50, bytes_received=0)], {}, 4.0)  # A restarted: its ledger is new
    rounds = {r["round"]: r for r in h.snapshot(5.0)["rounds"]}
    assert rounds[2] == {"round": 2, "bytes_sent": 660, "bytes_received": 400, "peers": 2}
    assert rounds[3] == {"round": 3, "bytes_sent": 100, "bytes_received": 100, "peers": 1}
    assert 1 not in rounds and 4 not in rounds  # the first sight counts nothing; a restart nothing < 0


def test_timeline_records_outcome_counters_as_they_grow() -> None:
    h = History("r")
    h.update([rec(rnd=5, committed=4, late=1)], {}, 1.0)  # counts from before: table only
    assert h.snapshot(1.0)["timeline"] == []
    h.update([rec(rnd=6, committed=5, late=1, outcome="committed")], {}, 2.0)
    h.update([rec(rnd=9, committed=6, late=2, failed=1, outcome="failed")], {}, 3.0)
    h.update([rec(rnd=9, committed=6, late=2, failed=1, outcome="failed")], {}, 4.0)
    snap = h.snapshot(5.0)
    assert [(e["round"], e["outcome"], e["n"]) for e in snap["timeline"]] == [
        (6, "committed", 1),
        (9, "committed", 1),
        (9, "late", 1),
        (9, "failed", 1),
    ]
    row = snap["peers"][0]
    assert (row["committed"], row["late"], row["failed"], row["outcome"]) == (6, 2, 1, "failed")
    assert snap["totals"] == {"committed": 6, "late": 2, "failed": 1}


def test_records_without_outcome_fields_or_with_odd_ones_read_as_zero() -> None:
    h = History("r")
    h.update([rec(), rec(B, committed="many", late=-3, failed=float("inf"), outcome="exploded")], {}, 1.0)
    for row in h.snapshot(1.0)["peers"]:
        assert (row["committed"], row["late"], row["failed"], row["outcome"]) == (0, 0, 0, "")


def test_bans_keep_the_time_first_seen_and_go_when_lifted() -> None:
    h = History("r")
    h.update([rec(A), rec(B)], {B: "3 strikes"}, 1.0)
    h.update([rec(A), rec(B)], {B: "4 strikes"}, 2.0)
    snap = h.snapshot(2.0)
    assert snap["bans"] == [{"peer": B, "reason": "4 strikes", "since": 1.0}]
    assert [r["banned"] for r in snap["peers"]] == [None, "4 strikes"]
    h.update([rec(A)], {}, 3.0)
    snap = h.snapshot(3.0)
    assert snap["bans"] == [] and snap["series"][B]["live"] is False and len(snap["peers"]) == 1


def test_bootstrap_nodes_are_listed_but_not_counted_as_trainers() -> None:
    h = History("r")
    h.update([rec(A, throughput=5.0), rec(B, role="bootstrap", throughput=0.0)], {}, 1.0)
    assert h.snapshot(1.0)["throughput"] == [[1.0, 5.0, 1]]


def test_poller_notes_a_failed_read_and_recovers() -> None:
    h = History("r")
    calls: list[int] = []

    def read() -> tuple[list[PeerRecord], dict[str, str]]:
        calls.append(1)
        if len(calls) == 1:
            raise TimeoutError("the DHT did not answer")
        return [rec(step=len(calls), loss=1.0)], {}

    clock = iter([10.0, 11.0])
    poller = Poller(read, h, 5.0, clock=lambda: next(clock))
    assert poller.poll_once() is False
    assert h.snapshot(10.0)["error"] == "TimeoutError: the DHT did not answer"
    assert poller.poll_once() is True
    snap = h.snapshot(11.0)
    assert snap["error"] is None and snap["polls"] == 1 and snap["updated"] == 11.0
    with pytest.raises(ValueError):
        Poller(read, h, 0.0)


def test_poller_thread_polls_until_stopped() -> None:
    h = History("r")
    done = threading.Event()
    n = [0]

    def read() -> tuple[list[PeerRecord], dict[str, str]]:
        n[0] += 1
        if n[0] >= 3:
            done.set()
        return [rec(step=n[0], loss=1.0)], {}

    poller = Poller(read, h, 0.01)
    poller.start()
    try:
        assert done.wait(30)
    finally:
        poller.stop()
    polls = h.snapshot(0.0)["polls"]
    assert polls >= 3 and h.snapshot(0.0)["polls"] == polls  # stopped: no more polls


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_server_serves_the_page_and_strict_json() -> None:
    h = History("my-run")
    h.update([rec(A, step=3, loss=float("nan")), rec(B, step=4, loss=2.0)], {}, 1.0)
    srv = DashboardServer("127.0.0.1", 0, lambda: h.snapshot(2.0))
    srv.start()
    try:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", srv.url)
        code, headers, body = _get(srv.url)
        assert code == 200 and headers["Content-Type"].startswith("text/html")
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        assert body.decode() == PAGE
        code, headers, body = _get(srv.url + "api/state?x=1")
        assert code == 200 and headers["Content-Type"] == "application/json"
        state = strict(body.decode())
        assert state["run_id"] == "my-run" and [p["peer"] for p in state["peers"]] == [A, B]
        assert state["peers"][0]["loss"] is None
        assert _get(srv.url + "nope")[0] == 404
    finally:
        srv.close()


def test_page_loads_nothing_from_outside() -> None:
    """Works offline: no URL but the SVG namespace, no src/href, and the elements tests rely on."""
    assert set(re.findall(r"https?://[^\s\"'<>)]+", PAGE)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"\b(src|href)\s*=|@import|url\(", PAGE)
    assert "innerHTML" not in PAGE  # peer-supplied strings are text, never markup
    for el in ("peers", "loss-curve", "loss-points", "bytes-per-round", "timeline", "bans", "throughput"):
        assert f'id="{el}"' in PAGE


def test_command_rejects_bad_input_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    maddr = "/ip4/127.0.0.1/tcp/1/p2p/QmWjz6xb8v9K4KnYEwP5Yk75k5mMBCehzWFLCvvQpYxF3d"
    assert cli_run(["dashboard", "--initial-peers", maddr, "--interval", "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        "swarmtrain: error: --interval must be a positive number of seconds, not 0.0"
    )
    assert cli_run(["dashboard", "--initial-peers", maddr, "--interval", "nan"]) == 2
    assert "--interval" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # --run-id names the run, so no manifest is fetched from the (dead) peer first
        args = ["dashboard", "--initial-peers", maddr, "--run-id", "r", "--port", str(port)]
        assert cli_run(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"swarmtrain: error: cannot serve the dashboard on 127.0.0.1:{port}"
    )
    assert cli_run(["dashboard", "--initial-peers", maddr, "--port", "70000"]) == 2
