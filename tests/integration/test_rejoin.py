"""A volunteer SIGKILLed and restarted with the same identity, as real ``swarmtrain join`` processes on
127.0.0.1: it resumes from its own saved state when the donors still vouch for it as their freshest
(no state bytes downloaded, and it goes on committing the run's rounds with the same parameters), and
downloads once when its saved state is stale."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peers import PeerProcess, find_orphans, spawn_command

LOOP = ["--host-maddrs", "/ip4/127.0.0.1/tcp/0"]
#: ``swarmtrain`` with this project's INFO lines on (when rounds commit, what was downloaded or resumed)
WRAPPER = """
import logging, sys
logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
for name in ("swarmtrain", "peers"):
    logging.getLogger(name).setLevel(logging.INFO)
from swarmtrain.app.cli import main
sys.argv[0] = "swarmtrain"
main()
"""
COMMITTED = r"round (\d+) committed"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SWARMTRAIN_TRAIN__THREADS": "1",
            "SWARMTRAIN_PEERS__OPEN_UNPROTECTED": "true",  # open with the mean on loopback
            "SWARMTRAIN_TRAIN__EVAL_INTERVAL": "100000",
            "SWARMTRAIN_TRAIN__BATCH_SIZE": "8",
            "SWARMTRAIN_TRAIN__EVAL_BATCHES": "2",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


class _Run:
    def __init__(self, tmp: Path, extra_env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.extra_env = extra_env or {}  # for the volunteers (``join``)
        self.procs: list[PeerProcess] = []
        self.maddr = ""

    def start_dht(self) -> None:
        out = self.tmp / "dht.out"
        argv = [sys.executable, "-m", "swarmtrain", "dht", *LOOP, "--run-id", "rejoin"]
        self.procs.append(spawn_command(argv, env=_env(), stdout=out.open("w"), stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        while not (m := re.search(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)", out.read_text())):
            assert time.monotonic() < deadline and self.procs[0].alive, out.read_text()
            time.sleep(0.2)
        self.maddr = m.group(1)

    def join(self, name: str, key: Path) -> PeerProcess:
        argv = [sys.executable, "-c", WRAPPER, "join", "--initial-peers", self.maddr, "--run-id", "rejoin"]
        argv += [*LOOP, "-s", "diloco", "-H", "10", "--compressor", "int8", "--steps", "100000"]
        argv += ["--identity", str(key), "--json", str(self.tmp / f"{name}.json")]
        out, err = (self.tmp / f"{name}.out").open("w"), (self.tmp / f"{name}.err").open("w")
        p = spawn_command(argv, env={**_env(), **self.extra_env}, stdout=out, stderr=err)
        self.procs.append(p)
        return p

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.err").read_text(errors="replace")

    def wait_commits(self, name: str, p: PeerProcess, n: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while len(re.findall(COMMITTED, self.log(name))) < n:
            assert p.alive and time.monotonic() < deadline, self.log(name)[-2500:]
            time.sleep(0.1)

    def stop(self, peers: dict[str, PeerProcess]) -> dict[str, dict]:
        """SIGTERM ``peers`` together (one left alone would wait out its round's deadline); their
        ``--json`` summaries."""
        for p in peers.values():
            p.signal(signal.SIGTERM)
        for name, p in peers.items():
            assert p.join(120) and p.exitcode == 0, self.log(name)[-2500:]
        return {name: json.loads((self.tmp / f"{name}.json").read_text()) for name in peers}


def _state_bytes(res: dict) -> int:
    return int(res["ledger"].get("by_kind", {}).get("state", {}).get("received", 0))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_restarted_volunteer_resumes_its_own_state_or_downloads_once(tmp_path: Path) -> None:
    from peers.keys.identity import ensure_identity
    from swarmtrain.app.peer.saved_state import saved_state_path

    run = _Run(tmp_path)
    key_a, key_c = tmp_path / "key_a", tmp_path / "key_c"
    ensure_identity(key_a)
    ensure_identity(key_c)
    saved = saved_state_path(key_c)
    assert saved is not None
    try:
        run.start_dht()
        a = run.join("a", key_a)
        c = run.join("c", key_c)
        run.wait_commits("c", c, 1)
        os.killpg(c.pid, signal.SIGKILL)  # a crash, right after a commit: alone, `a` commits nothing
        shutil.copy(saved, tmp_path / "old.safetensors")  # stale once c2 committed a round
        assert c.join(30)

        c2 = run.join("c2", key_c)  # same identity; the donor still vouches for its saved state
        run.wait_commits("c2", c2, 1)
        res2 = run.stop({"c2": c2})["c2"]
        assert "resumed from its own saved state" in run.log("c2"), run.log("c2")[-2500:]
        assert res2["downloads"] == [] and _state_bytes(res2) == 0

        shutil.copy(tmp_path / "old.safetensors", saved)  # a state the run has moved past
        c3 = run.join("c3", key_c)
        run.wait_commits("c3", c3, 1)
        ends = run.stop({"c3": c3, "a": a})
        res3, res_a = ends["c3"], ends["a"]
    finally:
        for p in run.procs:
            p.terminate(grace=3.0)
    assert "resumed from its own saved state" not in run.log("c3")
    assert len(res3["downloads"]) == 1 and _state_bytes(res3) > 0, run.log("c3")[-2500:]
    # both restarts took part in the run's rounds with the run's parameters
    for res in (res2, res3):
        common = set(res["sync_digests"]) & set(res_a["sync_digests"])
        assert common, (res["sync_digests"], res_a["sync_digests"])
        assert all(res["sync_digests"][r] == res_a["sync_digests"][r] for r in common)
    assert not [o for p in run.procs for o in find_orphans(p.marker)]
