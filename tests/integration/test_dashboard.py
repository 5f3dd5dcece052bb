"""``swarmtrain dashboard`` against a real local run (``dht`` + two ``join`` volunteers on 127.0.0.1),
looked at by Debian's headless Chromium: the page lists the run's peers and its loss curve grows.

The final screenshot is saved under the test's tmp_path; with ``SAVE_DASHBOARD_SCREENSHOT=1`` the
run goes on a little longer and the screenshot is copied to ``docs/img/dashboard.png`` (the README's).
(Not a ``SWARMTRAIN_`` variable: the peers' config refuses unknown ones of those.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from peer_helpers import SWARMTRAIN as SW
from test_join import _env, _join, _start_dht

from peers import PeerProcess, find_orphans, spawn_command
from peers.keys.identity import ensure_identity

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]
SAVE = os.environ.get("SAVE_DASHBOARD_SCREENSHOT") == "1"
HANG_GUARD = 420.0  # seconds for the whole run to show what the test waits for (never a speed check)


def _chromium(tmp: Path, url: str, *mode: str) -> str:
    """Run headless Chromium once on ``url`` (``--dump-dom`` or ``--screenshot=...``); its stdout."""
    argv = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        "--virtual-time-budget=5000",  # page load, its first fetch of /api/state and the redraw
        "--window-size=1280,1000",
        "--hide-scrollbars",
        *mode,
        url,
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=tmp)
    assert out.returncode == 0, f"chromium exited {out.returncode}: {out.stderr[-2000:]}"
    return out.stdout


def _attr(dom: str, element_id: str, attr: str) -> str:
    """The value of ``attr`` on the element with ``id=element_id`` in serialised HTML."""
    tag = re.search(rf'<[^>]*\bid="{re.escape(element_id)}"[^>]*>', dom)
    assert tag, f"no #{element_id} in the page"
    value = re.search(rf'\b{attr}="([^"]*)"', tag.group(0))
    assert value, f"#{element_id} has no {attr}"
    return value.group(1)


def _state(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "api/state", timeout=30) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _loss_points(state: dict[str, Any]) -> int:
    return sum(sum(p[3] is not None for p in s["points"]) for s in state["series"].values())


def _wait_state(url: str, ok: Any, deadline: float, procs: list[PeerProcess], tmp: Path) -> dict[str, Any]:
    """Poll the dashboard's JSON until ``ok(state)``; fail early if a process died."""
    while True:
        state = _state(url)
        if ok(state):
            return state
        dead = [p for p in procs if not p.alive]
        logs = {
            n: (tmp / n).read_text()[-1500:] for n in ("a.err", "b.err", "dash.err") if (tmp / n).exists()
        }
        assert not dead, f"a process exited early: {logs}"
        assert time.monotonic() < deadline, f"the dashboard never showed it; last state {state}; logs {logs}"
        time.sleep(1.0)


@pytest.mark.slow  # 20-47 s: out of the quick loop
@pytest.mark.timeout(900)
def test_dashboard_shows_a_live_run_in_headless_chromium(tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        why = f"{CHROMIUM} is missing (Debian: apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    run = "dashtest"
    ids = {n: ensure_identity(tmp_path / f"key-{n}") for n in "ab"}
    procs: list[PeerProcess] = []
    dash: PeerProcess | None = None
    try:
        dht, maddr = _start_dht(tmp_path, run)
        procs.append(dht)
        common = ["-s", "diloco", "-H", "5", "--steps", "100000"]
        for name, region in (("a", "eu-west"), ("b", "us-east")):
            key = str(tmp_path / f"key-{name}")
            procs.append(_join(tmp_path, name, maddr, run, *common, "--identity", key, "--region", region))
        dash = spawn_command(
            [*SW, "dashboard", "--initial-peers", maddr, "--run-id", run, "--port", "0", "--interval", "1"],
            env=_env(),
            stdout=(tmp_path / "dash.out").open("w"),
            stderr=(tmp_path / "dash.err").open("w"),
        )
        procs.append(dash)
        deadline = time.monotonic() + HANG_GUARD
        url = ""
        while not url:
            m = re.search(r"http://127\.0\.0\.1:\d+/", (tmp_path / "dash.out").read_text())
            url = m.group(0) if m else ""
            assert dash.alive and time.monotonic() < deadline, (tmp_path / "dash.err").read_text()[-2000:]
            time.sleep(0.2)

        def both_have_loss(st: dict[str, Any]) -> bool:
            with_loss = {p["peer"] for p in st["peers"] if p["loss"] is not None}
            return with_loss >= set(ids.values()) and _loss_points(st) >= 2

        _wait_state(url, both_have_loss, deadline, procs, tmp_path)
        first = _chromium(tmp_path, url, "--dump-dom")
        table = re.search(r'<table id="peers">.*?</table>', first, re.S)
        assert table, "no peers table"
        for peer in ids.values():  # the peers table lists the run's peers (full IDs in data-peer)
            assert f'<tr data-peer="{peer}">' in table.group(0)
        assert "eu-west" in table.group(0) and "us-east" in table.group(0)
        n1 = int(_attr(first, "loss-points", "data-count"))
        assert n1 >= 2 and _attr(first, "loss-curve", "data-points") == str(n1)
        assert first.count('class="series"') >= 2  # a loss polyline per peer

        more = 40 if SAVE else 4  # the README's screenshot shows a longer curve
        _wait_state(url, lambda st: _loss_points(st) >= n1 + more, deadline, procs, tmp_path)
        second = _chromium(tmp_path, url, "--dump-dom")
        n2 = int(_attr(second, "loss-points", "data-count"))
        assert n2 > n1, (n1, n2)
        assert re.search(r'<rect[^>]*data-outcome="committed"', second)  # the round timeline
        assert "<g data-round=" in second  # bytes per round has bars
        # each volunteer's contribution (issue 31.6): a row per volunteer, tokens only with committed rounds
        contrib = re.search(r'<table id="contributions">.*?</table>', second, re.S)
        assert contrib, "no contributions table"
        rows = re.findall(r'<tr data-peer="(\w+)" data-tokens="(\d+)" data-rounds="(\d+)">', contrib.group(0))
        assert {r[0] for r in rows} == set(ids.values()), rows
        assert all((int(t) > 0) == (int(n) > 0) for _, t, n in rows) and any(int(n) for _, _, n in rows), rows

        shot = tmp_path / "dashboard.png"
        _chromium(tmp_path, url, f"--screenshot={shot}")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        if SAVE:
            dest = REPO / "docs" / "img" / "dashboard.png"
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, dest)

        dash.signal(signal.SIGTERM)  # Ctrl-C/SIGTERM: a clean exit
        assert dash.join(60), "the dashboard did not stop on SIGTERM"
        assert dash.exitcode == 0, (tmp_path / "dash.err").read_text()[-2000:]
        assert "shutting down" in (tmp_path / "dash.out").read_text()
    finally:
        for p in procs:
            p.terminate(grace=3.0)
    assert not [o for p in procs for o in find_orphans(p.marker)]
