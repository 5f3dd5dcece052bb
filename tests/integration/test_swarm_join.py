"""``swarmtrain join --role server|trainer`` as real processes on 127.0.0.1: a 2-stage SWARM run
made of a ``swarmtrain dht`` bootstrap, a server given ``--stage 0``, a server that picks its stage
itself (``--stage auto``: the bottleneck, stage 1, the one nobody serves) and a trainer, all reading
the run-wide settings from the config's ``[swarm]`` section."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from peer_helpers import SWARMTRAIN, cli_env, spawn_join, start_cli_dht, wait_exit

from peers import PeerProcess, find_orphans

MICROBATCHES, ACCUMULATE, BATCH = 12, 2, 8

CONFIG = f"""
[train]
batch_size = {BATCH}
threads = 1
eval_batches = 2

[peers]
open_unprotected = true  # an open run on loopback, a trusted network

[swarm]
stages = 2
trainers = 1
microbatches = {MICROBATCHES}
accumulate = {ACCUMULATE}
"""


def _env() -> dict[str, str]:
    return cli_env(keep_settings=False)


def _start_dht(tmp: Path, run: str) -> tuple[PeerProcess, str]:
    return start_cli_dht(tmp, run, _env())


def _join(tmp: Path, name: str, maddr: str, run: str, *args: str) -> PeerProcess:
    return spawn_join(tmp, name, maddr, run, *args, env=_env(), config=tmp / "run.toml")


def _wait_out(tmp: Path, name: str, procs: list[PeerProcess], pattern: str, timeout: float) -> str:
    """Wait until ``name``'s stdout matches ``pattern``, while every process of ``procs`` lives."""
    deadline = time.monotonic() + timeout
    while True:
        text = (tmp / f"{name}.out").read_text()
        if re.search(pattern, text):
            return text
        tail = (tmp / f"{name}.err").read_text()[-2000:]
        assert all(p.alive for p in procs) and time.monotonic() < deadline, text + tail
        time.sleep(0.3)


def _wait_server_record(maddr: str, run: str, stage: int, timeout: float = 120.0) -> None:
    """Wait until ``swarmtrain status`` lists a server of ``stage`` (its record is published in the
    background after its first line)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = subprocess.run(
            [*SWARMTRAIN, "status", "--initial-peers", maddr, "--run-id", run, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(),
        )
        if status.returncode == 0:
            recs = json.loads(status.stdout)
            if any(r["role"] == "server" and r["extra"].get("stage") == stage for r in recs):
                return
        time.sleep(1.0)
    raise AssertionError(f"no server record of stage {stage} in the DHT")


@pytest.mark.timeout(900)
def test_server_and_trainer_roles_train_a_two_stage_pipeline(tmp_path: Path) -> None:
    run = "swarmjoin"
    (tmp_path / "run.toml").write_text(CONFIG)
    procs: list[PeerProcess] = []
    try:
        dht, maddr = _start_dht(tmp_path, run)
        procs.append(dht)
        a = _join(tmp_path, "a", maddr, run, "--role", "server", "--stage", "0")
        procs.append(a)
        line = _wait_out(tmp_path, "a", procs, r"server: serving stage 0 of 2 \(--stage\) as \w+", 300)
        _wait_server_record(maddr, run, 0)
        b = _join(tmp_path, "b", maddr, run, "--role", "server")  # --stage auto
        procs.append(b)
        _wait_out(tmp_path, "b", procs, r"server: serving stage 1 of 2 \(auto: the bottleneck stage\)", 300)
        t = _join(tmp_path, "t", maddr, run, "--role", "trainer")
        procs.append(t)
        wait_exit(t, 600, "t", tmp_path)
        trainer = json.loads((tmp_path / "t.json").read_text())
        assert trainer["role"] == "trainer" and trainer["index"] == 0
        assert trainer["completed"] == MICROBATCHES and trainer["lost"] == 0
        assert trainer["samples"] == MICROBATCHES * BATCH
        assert (
            f"{MICROBATCHES}/{MICROBATCHES} micro-batches completed, 0 lost"
            in (tmp_path / "t.out").read_text()
        )
        for p in (a, b):
            p.signal(signal.SIGTERM)
        for p, name in ((a, "a"), (b, "b")):
            wait_exit(p, 180, name, tmp_path)
        srv = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab"}
        assert (srv["a"]["stage"], srv["a"]["stage_auto"]) == (0, False), line
        assert (srv["b"]["stage"], srv["b"]["stage_auto"]) == (1, True)
        # both stages took every optimizer step of the run, on every micro-batch
        assert srv["a"]["version"] == srv["b"]["version"] == MICROBATCHES // ACCUMULATE
        # requests: every micro-batch reached both stages (forward and backward, or both in one on
        # the last stage), plus the trainer's step closes
        assert all(srv[n]["served"] >= MICROBATCHES and srv[n]["step_failures"] == 0 for n in "ab")
        for n, stage in (("a", 0), ("b", 1)):
            assert f"server left: stage {stage}, " in (tmp_path / f"{n}.out").read_text()
    finally:
        for p in procs:
            p.terminate(grace=3.0)
    assert not [o for p in procs for o in find_orphans(p.marker)]
