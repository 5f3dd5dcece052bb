"""A failed peer keeps its traceback (issue 28, point 3): ``swarmtrain -v simulate`` and ``swarmtrain -v
join`` print the traceback of the error raised inside the peer; without ``-v`` the error stays one line.

The peer fails for a real reason, inside its own process: its ``--data`` is a ``.bin`` token file of
odd size (three bytes). The parent only checks that the path exists before it starts anything; the
peer reads the file when it builds its trainer, after its node is up, and raises there
(``build_bin_corpus``). Nothing here mocks or injects a fault.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peers import PeerProcess, find_orphans, spawn_command

SW = [sys.executable, "-m", "swarmtrain"]
LOOP = ["--host-maddrs", "/ip4/127.0.0.1/tcp/0"]
#: the frame the peer raises in (swarmtrain/app/data/corpus.py)
RAISED_IN = "in build_bin_corpus"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "COLUMNS": "80",
            "PYTHONUNBUFFERED": "1",
            "SWARMTRAIN_TRAIN__THREADS": "1",
            "SWARMTRAIN_PEERS__OPEN_UNPROTECTED": "true",  # an open run on loopback (as test_join)
        }
    )
    return env


def _odd_bin(tmp: Path) -> Path:
    path = tmp / "odd.bin"
    path.write_bytes(b"abc")  # uint16 tokens need an even size
    return path


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SW, *argv], capture_output=True, text=True, timeout=300, env=_env())


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("swarmtrain: error:")]


def _check_one_line(proc: subprocess.CompletedProcess[str], expected: str) -> None:
    """The default: one error line naming the peer's exception, no traceback."""
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and re.fullmatch(expected, errors[0]), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and RAISED_IN not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == errors[0]


def _check_traceback(proc: subprocess.CompletedProcess[str], expected: str) -> str:
    """``-v``: the same one line, with the traceback of the raise above it; returns the traceback."""
    errors = _error_lines(proc.stderr)
    assert len(errors) == 1 and re.fullmatch(expected, errors[0]), proc.stderr[-3000:]
    start = proc.stderr.rfind("Traceback (most recent call last):")
    end = proc.stderr.index(errors[0])
    assert 0 <= start < end, proc.stderr[-3000:]
    tb = proc.stderr[start:end]
    assert RAISED_IN in tb and "corpus.py" in tb, tb
    assert tb.rstrip().splitlines()[-1].startswith("swarmtrain.core.errors.ConfigError: data.paths:"), tb
    return tb


#: per strategy: extra flags, the peer that fails (the line), its process's entry point, and frames
#: of the parent that must not show (its re-raise)
SIMULATIONS = {
    "diloco": (
        ["-H", "1"],
        r"peer [01]",
        "in peer_main",
        ("in run_simulation", "in collect", "in _handle", "in _run_one"),
    ),
    "swarm": (
        ["--strategy", "swarm"],
        r"server \d+",
        "in _server_main",
        ("in run_swarm_simulation", "in _poll", "in _wait", "in poll"),
    ),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", list(SIMULATIONS))
def test_simulate_prints_the_peers_own_traceback_with_v(tmp_path: Path, strategy: str) -> None:
    flags, who, entry, parent_frames = SIMULATIONS[strategy]
    data = _odd_bin(tmp_path)
    args = ["simulate", "--peers", "2", "--data", str(data), "--steps", "2", "--batch-size", "2", *flags]
    line = rf"swarmtrain: error: {who}: ConfigError: data\.paths: .*odd\.bin has an odd size; .*"

    plain = _cli(*args)
    assert plain.returncode == 1, plain.stderr[-3000:]
    _check_one_line(plain, line)

    verbose = _cli("-v", *args)
    assert verbose.returncode == 1, verbose.stderr[-3000:]
    tb = _check_traceback(verbose, line)
    # the peer process's own frames (its entry point), none of the parent's re-raise
    assert entry in tb, tb
    for frame in parent_frames:
        assert frame not in tb, tb
    assert tb.count("Traceback (most recent call last):") == 1, tb


def _start_dht(tmp: Path, run: str) -> tuple[PeerProcess, str]:
    out = tmp / "dht.out"
    proc = spawn_command(
        [*SW, "dht", *LOOP, "--run-id", run], env=_env(), stdout=out.open("w"), stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        m = re.search(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)", out.read_text())
        if m:
            return proc, m.group(1)
        assert proc.alive, out.read_text()
        time.sleep(0.2)
    raise AssertionError("the bootstrap node printed no multiaddr")


@pytest.mark.timeout(600)
def test_join_prints_the_peers_traceback_with_v(tmp_path: Path) -> None:
    """``join`` runs its peer in its own process: the traceback is of the raise in the peer's
    trainer, after the node joined the run's DHT."""
    run = "peer-traceback"
    data = _odd_bin(tmp_path)
    dht, maddr = _start_dht(tmp_path, run)
    try:
        args = ["join", "--initial-peers", maddr, "--run-id", run, *LOOP, "--data", str(data)]
        args += ["-s", "diloco", "--steps", "5"]
        line = r"swarmtrain: error: data\.paths: .*odd\.bin has an odd size; expected uint16 tokens"

        plain = _cli(*args)
        assert plain.returncode == 2, plain.stderr[-3000:]
        _check_one_line(plain, line)

        verbose = _cli("-v", *args)
        assert verbose.returncode == 2, verbose.stderr[-3000:]
        tb = _check_traceback(verbose, line)
        assert "in run_peer" in tb and "in run_volunteer" in tb, tb  # raised in the running peer
        assert dht.alive
    finally:
        dht.terminate(grace=3.0)
    assert not find_orphans(dht.marker)
