"""``swarmtrain dht`` + ``swarmtrain join`` as real processes on 127.0.0.1: newcomers, leaving."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from peer_helpers import SWARMTRAIN, cli_env, spawn_join, start_cli_dht, wait_exit

from peers import PeerProcess, find_orphans

# these runs are open with the mean on loopback (a trusted network); join refuses that pairing
# elsewhere (test_manifest_join, test_open_policy)
SETTINGS = {
    "SWARMTRAIN_TRAIN__THREADS": "1",
    "SWARMTRAIN_PEERS__OPEN_UNPROTECTED": "true",
    "SWARMTRAIN_TRAIN__EVAL_INTERVAL": "100000",
    "SWARMTRAIN_TRAIN__BATCH_SIZE": "8",
    "SWARMTRAIN_TRAIN__EVAL_BATCHES": "4",
}


def _env() -> dict[str, str]:
    return cli_env(SETTINGS)


def _start_dht(tmp: Path, run: str) -> tuple[PeerProcess, str]:
    return start_cli_dht(tmp, run, _env())


def _join(tmp: Path, name: str, maddr: str, run: str, *args: str) -> PeerProcess:
    return spawn_join(tmp, name, maddr, run, *args, env=_env())


def _wait_log(tmp: Path, name: str, procs: list[PeerProcess], pattern: str, timeout: float) -> None:
    """Wait until ``name``'s stderr matches ``pattern`` (regex), while every process of ``procs`` lives."""
    deadline = time.monotonic() + timeout
    log = tmp / f"{name}.err"
    while not re.search(pattern, log.read_text()):
        assert all(p.alive for p in procs) and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.3)


def _identities(tmp: Path, newcomer_smallest: bool) -> dict[str, str]:
    """Key files for peers a, b, c such that c's peer ID is the smallest (it would lead every round
    it joins in time) or the largest of the three."""
    from peers.keys.identity import ensure_identity

    ids = sorted((ensure_identity(tmp / f"key{i}"), str(tmp / f"key{i}")) for i in range(3))
    order = [ids[1], ids[2], ids[0]] if newcomer_smallest else ids
    return {name: path for name, (_, path) in zip("abc", order, strict=True)}


@pytest.mark.slow
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("newcomer_smallest", [True, False], ids=["newcomer-smallest", "newcomer-largest"])
def test_newcomer_downloads_state_and_ends_identical(tmp_path: Path, newcomer_smallest: bool) -> None:
    """Two peers train with DiLoCo; a third joins mid-run, adopts the swarm's state (bit-exact), takes
    part in the swarm's rounds and ends with the same global parameters as the others. With the
    smallest ID the newcomer is the leader of any round it joins in time, so a round the others formed
    before it arrived must show it as late (not let it publish a second list of its own)."""
    run = "jointest"
    procs: list[PeerProcess] = []
    keys = _identities(tmp_path, newcomer_smallest)
    try:
        dht, maddr = _start_dht(tmp_path, run)
        procs.append(dht)
        common = ["-s", "diloco", "-H", "10", "--compressor", "int8", "--steps", "120"]
        a = _join(tmp_path, "a", maddr, run, *common, "--identity", keys["a"])
        b = _join(tmp_path, "b", maddr, run, *common, "--identity", keys["b"])
        procs += [a, b]
        # a few outer steps done (the piped live line comes every 10 s: round 3 itself may be skipped)
        _wait_log(tmp_path, "a", [a, b], r" round ([3-9]|\d\d+) ", 600)
        c = _join(tmp_path, "c", maddr, run, *common, "--identity", keys["c"])
        procs.append(c)
        for p, name in ((a, "a"), (b, "b"), (c, "c")):
            wait_exit(p, 900, name, tmp_path)
        res = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in "abc"}
        first = res["c"]["downloads"][0]
        # the newcomer's downloaded global parameters equal the donors' after that round, bit for bit
        assert first["digest"] in set(res["a"]["sync_digests"].values())
        assert first["round"] >= 3
        assert (res["c"]["peer_id"] < res["a"]["peer_id"]) == newcomer_smallest
        # it then took part in the swarm's rounds: a late round costs one download, after which the
        # newcomer is in step with the others (a few late rounds at most, not one per round)
        c_log = (tmp_path / "c.err").read_text()[-3000:]
        assert res["c"]["committed_rounds"] >= 1, c_log
        assert res["c"]["late_rounds"] <= 3 and res["c"]["failed_rounds"] == 0, c_log
        common_rounds = set.intersection(*(set(res[n]["sync_digests"]) for n in "abc"))
        assert common_rounds
        for r in common_rounds:
            assert len({res[n]["sync_digests"][r] for n in "abc"}) == 1
        assert len({res[n]["final_digest"] for n in "abc"}) == 1
        assert res["c"]["ledger"]["by_kind"]["state"]["received"] > 0  # counted in the ledger
    finally:
        for p in procs:
            p.terminate(grace=3.0)
    assert not [o for p in procs for o in find_orphans(p.marker)]


@pytest.mark.slow
def test_sigterm_leaves_cleanly(tmp_path: Path) -> None:
    """SIGTERM makes a volunteer finish its step, deregister and exit 0, leaving no process behind."""
    run = "sigterm"
    procs: list[PeerProcess] = []
    try:
        dht, maddr = _start_dht(tmp_path, run)
        procs.append(dht)
        a = _join(tmp_path, "a", maddr, run, "-s", "diloco", "-H", "100000", "--steps", "100000")
        procs.append(a)
        _wait_log(tmp_path, "a", [a], "step ", 300)
        a.signal(signal.SIGTERM)
        wait_exit(a, 120, "a", tmp_path)
        assert "stopped by signal" in (tmp_path / "a.out").read_text()
        assert json.loads((tmp_path / "a.json").read_text())["stopped_by_signal"] is True
        status = subprocess.run(
            [*SWARMTRAIN, "status", "--initial-peers", maddr, "--run-id", run, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(),
        )
        assert status.returncode == 0, status.stderr
        roles = [r["role"] for r in json.loads(status.stdout)]
        assert "trainer" not in roles  # deregistered at once (tombstone), not after the TTL
        assert not find_orphans(a.marker)
    finally:
        for p in procs:
            p.terminate(grace=3.0)


def _readme_config(tmp: Path) -> Path:
    """The README's example config (its ```toml block under Configuration), as a file."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"```toml\n(\[strategy\].*?)```", readme, re.S)
    assert block, "the README lost its example config"
    path = tmp / "run.toml"
    path.write_text(block.group(1))
    return path


@pytest.mark.slow
def test_volunteers_whose_rounds_keep_failing_say_why_and_give_up(tmp_path: Path) -> None:
    """The README's example config (centered_clip tolerating f=2, which needs 5 peers) with four
    volunteers: every round fails. Each says so before training (too few trainers for the reducer),
    says why at normal verbosity after a few failed rounds and exits 1 with that reason once
    ``peers.give_up_after`` passed, instead of looping forever (issue 17)."""
    cfg = _readme_config(tmp_path)
    assert "centered_clip" in cfg.read_text() and "byzantine_f = 2" in cfg.read_text()
    run = "give-up"
    env = {"SWARMTRAIN_PEERS__GIVE_UP_AFTER": "18", "SWARMTRAIN_PEERS__ROUND_TIMEOUT": "15"}
    procs: list[PeerProcess] = []
    try:
        dht, maddr = _start_dht(tmp_path, run)
        procs.append(dht)
        os.environ.update(env)  # _join passes _env(), a copy of os.environ
        try:
            vols = [
                _join(tmp_path, n, maddr, run, "--config", str(cfg), "-H", "2", "--steps", "100000")
                for n in "abcd"
            ]
        finally:
            for k in env:
                del os.environ[k]
        procs += vols
        for name, p in zip("abcd", vols, strict=True):
            assert p.join(300), f"{name} did not give up: {(tmp_path / f'{name}.err').read_text()[-2000:]}"
            err = (tmp_path / f"{name}.err").read_text()
            assert p.exitcode == 1, err[-2000:]
            assert "rounds in a row failed; the last:" in err and "needs n >= 5" in err, err[-2000:]
            # said before the first round: the run has too few trainers for the reducer
            first = err.index("needs n >= 5 peers per round; the run has")
            assert first < err.index("rounds in a row failed"), err[-2000:]
            last = err.strip().splitlines()[-1]
            assert last.startswith("swarmtrain: error: no round committed in"), last
            assert "needs n >= 5" in last and "Traceback" not in err
    finally:
        for p in procs:
            p.terminate(grace=3.0)


@pytest.mark.slow
def test_a_volunteer_with_another_codec_is_refused_in_one_line(tmp_path: Path) -> None:
    """A run trains with int8; a volunteer set to ternary would fail every round. It reads the live
    trainers' signed records before downloading anything and exits 2 with one line naming the run's
    codec and the flag, instead of looping (issue 17, point 1)."""
    run = "codec-mismatch"
    procs: list[PeerProcess] = []
    try:
        dht, maddr = _start_dht(tmp_path, run)
        procs.append(dht)
        a = _join(
            tmp_path, "a", maddr, run, "-s", "diloco", "-H", "5", "--compressor", "int8", "--steps", "100000"
        )
        procs.append(a)
        _wait_log(tmp_path, "a", [a], "step ", 180)  # a trains: its record is out
        b = _join(
            tmp_path, "b", maddr, run, "-s", "diloco", "-H", "5", "--compressor", "ternary", "--steps", "5"
        )
        procs.append(b)
        assert b.join(180), (tmp_path / "b.err").read_text()[-2000:]
        err = (tmp_path / "b.err").read_text()
        assert b.exitcode == 2, err[-2000:]
        assert err.strip().splitlines()[-1] == (
            "swarmtrain: error: this run's trainers use codec 'int8' (1 of 1); this peer is set to "
            "'ternary': join with --compressor int8 (or the run's config file)"
        )
        assert "step " not in err and "Traceback" not in err  # refused before training
        assert a.alive
    finally:
        for p in procs:
            p.terminate(grace=3.0)
