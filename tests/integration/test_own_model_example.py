"""``examples/own_model_diloco.py`` as a user runs it: two real peer processes on 127.0.0.1 train the
example's own MLP with DiLoCo (int8) through ``swarmtrain.connect``.

Checked from its output: every sync committed with both peers, the two peers printed the same
parameter digest after each sync, each peer's loss fell from the first sync to the last, it exited 0
and left no process behind (found by an environment tag every descendant inherits: the second peer,
both DHT helpers and both p2pd daemons). The file stays a short example (< 40 lines of code), and a
bad flag is one line and exit 2.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_model_diloco.py"
TREE_ENV = "OWN_MODEL_TEST_TREE"  # not SWARMTRAIN_*: the config reads those
LINE = re.compile(
    r"^peer (?P<rank>[01]) step (?P<step>\d+) loss (?P<loss>[0-9.]+) sync (?P<outcome>.+?) "
    r"params (?P<digest>[0-9a-f]{16})$"
)
STEPS, INNER = 60, 10  # a few syncs: the first outer steps may overshoot before the loss falls


def _tree(tag: str) -> list[Any]:
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            mine = p.environ().get(TREE_ENV) == tag
            if mine and p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def _code_lines(path: Path) -> int:
    """Lines that are neither blank nor comments (the docstring counts)."""
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return sum(1 for line in lines if line and not line.startswith("#"))


def test_example_is_short() -> None:
    assert _code_lines(EXAMPLE) < 40


def test_two_peers_train_the_users_model_and_agree_after_every_sync() -> None:
    tag = uuid.uuid4().hex
    env = {**os.environ, TREE_ENV: tag}
    argv = [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--inner-steps", str(INNER)]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        leftovers = _tree(tag)
        deadline = time.monotonic() + 5.0  # helpers that are exiting on their own
        while leftovers and time.monotonic() < deadline:
            time.sleep(0.2)
            leftovers = _tree(tag)
        for p in leftovers:
            p.kill()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-2000:]}\n{err[-3000:]}"
    assert leftovers == [], f"left behind: {[' '.join(p.cmdline()[:2]) for p in leftovers]}"

    syncs: dict[int, dict[int, tuple[float, str, str]]] = {0: {}, 1: {}}  # rank -> step -> row
    for line in out.splitlines():
        m = LINE.match(line)
        assert m, f"unexpected output line {line!r}"
        syncs[int(m["rank"])][int(m["step"])] = (float(m["loss"]), m["outcome"], m["digest"])
    sync_steps = list(range(INNER, STEPS + 1, INNER))
    for rank in (0, 1):
        assert sorted(syncs[rank]) == sync_steps, out
        assert all(row[1] == "committed by 2 peers" for row in syncs[rank].values()), out
        first, last = syncs[rank][sync_steps[0]][0], syncs[rank][sync_steps[-1]][0]
        assert last < first, f"peer {rank}: loss {first} -> {last}\n{out}"
    for step in sync_steps:
        assert syncs[0][step][2] == syncs[1][step][2], f"parameters differ after step {step}'s sync\n{out}"
    assert len({syncs[0][s][2] for s in sync_steps}) == len(sync_steps), "the parameters never moved"


def test_bad_flag_is_one_line_and_exit_2() -> None:
    res = subprocess.run(
        [sys.executable, str(EXAMPLE), "--inner-steps", "0"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2, res
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert res.stdout == ""
