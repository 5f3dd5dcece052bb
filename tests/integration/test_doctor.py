"""``swarmtrain doctor`` as a real process: alone (a fresh clone, no peers), and against a local run
(``swarmtrain dht`` plus a ``swarmtrain join`` volunteer on 127.0.0.1) whose peers it probes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from peer_helpers import SWARMTRAIN as SW
from test_join import _env, _join, _start_dht, _wait_log

from peers import PeerProcess

_HANG_GUARD = 240  # seconds; a hang guard, not a speed assertion


def _doctor(*args: str) -> tuple[int, dict[str, Any], str]:
    p = subprocess.run(
        [*SW, "doctor", "--json", *args], capture_output=True, text=True, timeout=_HANG_GUARD, env=_env()
    )
    return p.returncode, json.loads(p.stdout) if p.stdout.strip() else {}, p.stderr


def test_doctor_without_peers_checks_this_machine() -> None:
    rc, out, err = _doctor()
    assert rc == 0, err
    by = {c["name"]: c for c in out["checks"]}
    assert by["p2p daemon"]["status"] == "ok" and by["p2p daemon"]["data"]["start_s"] > 0
    for name in ("reachability", "dht", "peers"):
        assert by[name]["status"] == "skip" and "no --initial-peers" in by[name]["detail"]
    assert by["throughput cpu"]["data"]["tokens_per_s"] > 0
    assert by["memory"]["data"]["cpu_need_bytes"] > 0
    assert out["verdict"]["role"].startswith("trainer")
    assert out["verdict"]["exit_code"] == 0


def test_doctor_measures_links_to_a_live_run(tmp_path: Path) -> None:
    run = "doctor"
    procs: list[PeerProcess] = []
    try:
        dht, maddr = _start_dht(tmp_path, run)
        procs.append(dht)
        a = _join(tmp_path, "a", maddr, run, "-s", "diloco", "-H", "100000", "--steps", "100000")
        procs.append(a)
        _wait_log(tmp_path, "a", [a], "step ", _HANG_GUARD)
        rc, out, err = _doctor("--initial-peers", maddr, "--run-id", run, "--peers", "3", "--timeout", "30")
        assert rc == 0, err
        by = {c["name"]: c for c in out["checks"]}
        assert by["dht"]["status"] == "ok" and by["dht"]["data"]["live_peers"] >= 2  # bootstrap + a
        probes = [c for c in out["checks"] if c["name"].startswith("peer ")]
        assert len(probes) >= 2
        for c in probes:
            assert c["status"] == "ok", c
            assert c["data"]["rtt_s"] > 0 and c["data"]["bandwidth_bps"] > 0
        assert by["peers"]["status"] == "ok"
        # loopback peers cannot answer AutoNAT: the honest answer is "unknown"
        assert by["reachability"]["data"]["answer"] == "unknown"
        assert by["reachability"]["detail"] == "no public peers to ask"
    finally:
        for p in procs:
            p.terminate(grace=3.0)
