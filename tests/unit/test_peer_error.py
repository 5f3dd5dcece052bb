"""``swarmtrain.core.peer_error``: a peer's error crosses its queue as two plain strings."""

from __future__ import annotations

import queue
import subprocess
import sys

import pytest

from swarmtrain.core.errors import ConfigError
from swarmtrain.core.peer_error import TRACEBACK, ErrorReports, PeerError, error_traceback, report_error


def _raise_in_peer() -> None:
    raise ValueError("bad shard\nsecond line")


def _report(rank: int) -> list[tuple[str, int, object]]:
    q: queue.Queue[tuple[str, int, object]] = queue.Queue()
    try:
        _raise_in_peer()
    except ValueError as e:
        report_error(q, rank, f"peer {rank}", e)
    return [q.get_nowait() for _ in range(q.qsize())]


def test_report_sends_the_traceback_then_the_line_as_strings() -> None:
    (k1, r1, text), (k2, r2, line) = _report(3)
    assert (k1, r1, k2, r2) == (TRACEBACK, 3, "error", 3)
    assert isinstance(text, str) and isinstance(line, str)
    assert text.startswith("Traceback (most recent call last):") and "in _raise_in_peer" in text
    assert line == "peer 3: ValueError: bad shard\nsecond line"


def test_the_parent_pairs_the_traceback_with_its_line() -> None:
    reports = ErrorReports()
    (_, rank, text), (_, _, line) = _report(1)
    reports.note(rank, text)
    err = reports.error(rank, line)
    assert isinstance(err, PeerError) and str(err) == line
    assert err.peer_traceback == text and error_traceback(err) == text
    assert reports.error(rank, "peer 1: stopped by a signal").peer_traceback is None  # taken once
    reports.note(2, "old")
    reports.forget(2)  # a restarted incarnation: what the old one sent is dropped
    assert reports.error(2, "x").peer_traceback is None


def test_error_traceback_of_a_local_error_is_its_own() -> None:
    try:
        raise ConfigError("here")
    except ConfigError as e:
        assert "test_error_traceback_of_a_local_error_is_its_own" in error_traceback(e)


@pytest.mark.parametrize("verbose", [False, True])
def test_the_cli_prints_the_traceback_only_with_v(verbose: bool) -> None:
    """An error of this process (a TOML file that does not exist): one line, or its traceback too.
    A subprocess: ``-v`` changes this process's logging filters."""
    argv = ["-v"] if verbose else []
    cmd = [sys.executable, "-m", "swarmtrain", *argv, "simulate", "--config", "/nonexistent/run.toml"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("swarmtrain: error:"), proc.stderr
    assert ("Traceback (most recent call last):" in proc.stderr) is verbose, proc.stderr
