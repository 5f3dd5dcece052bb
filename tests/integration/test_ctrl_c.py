"""Ctrl-C in a terminal reaches a volunteer's whole process group (its DHT process and p2p daemon
too). The volunteer finishes its step and leaves with its summary, and nothing else it runs dies
under it: no DHT call timing out into warnings while it finishes (issue 17, third-party noise)."""

from __future__ import annotations

import os
import pty
import re
import select
import sys
import time
from pathlib import Path

import pytest
from peer_helpers import LOOP
from test_join import _env, _start_dht


def _run_in_terminal(
    argv: list[str], env: dict[str, str], ctrl_c_after: str, limit: float
) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal, type Ctrl-C once the pattern ``ctrl_c_after`` shows; return
    (exit status, output without terminal escapes)."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        os.execve(argv[0], argv, env)
    out, sent, t0 = b"", False, time.monotonic()
    while time.monotonic() - t0 < limit:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            out += data
        if not sent and re.search(ctrl_c_after.encode(), out):
            os.write(fd, b"\x03")
            sent = True
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.decode(errors="replace"))
    return os.waitstatus_to_exitcode(status), text


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_leaves_cleanly_without_dht_warnings(tmp_path: Path) -> None:
    run = "ctrl-c"
    dht, maddr = _start_dht(tmp_path, run)
    try:
        env = {**_env(), "SWARMTRAIN_PEERS__ROUND_TIMEOUT": "10", "COLUMNS": "80", "TERM": "xterm"}
        argv = [sys.executable, "-m", "swarmtrain", "join", "--initial-peers", maddr, "--run-id", run, *LOOP]
        argv += ["-s", "diloco", "-H", "20", "--steps", "100000"]
        code, text = _run_in_terminal(argv, env, r"step ([3-9]|\d\d+) round", limit=240)
    finally:
        dht.terminate(grace=3.0)
    assert code == 0, text[-3000:]
    assert "received signal 2" in text and "stopped by signal:" in text, text[-3000:]
    after = text[text.index("received signal 2") :]
    assert "failed: TimeoutError" not in after and "announcing the state failed" not in after, after[-3000:]
    assert "Traceback" not in text and "Process DHT" not in text, text[-3000:]
