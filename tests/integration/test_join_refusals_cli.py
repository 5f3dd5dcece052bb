"""``swarmtrain join`` refusals as real processes against a live bootstrap on 127.0.0.1 (issue 31.4):
each names its own cause in one line, without Go log timestamps or hints that do not apply."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest
from test_manifest_join import _init, _join, _volunteer
from test_node import _start_dht

_GO_TIME = re.compile(r"\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}")


def _refusal(tmp: Path, maddr: str, key: Path | None, token: str) -> str:
    """The one line a refused join printed (exit 2)."""
    p = _join(tmp, maddr, key, token, "--steps", "2", stderr=subprocess.PIPE)
    _, err = p.communicate(timeout=180)
    lines = err.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, err[-2000:])
    assert not _GO_TIME.search(lines[0]) and "--config or --run-id" not in lines[0], lines[0]
    return lines[0]


@pytest.mark.timeout(600)
def test_each_join_refusal_names_its_own_cause(tmp_path: Path) -> None:
    run_dir, boot_token = _init(tmp_path, "run", "t-refusals")
    boot, _, maddrs = _start_dht(
        run_dir / "bootstrap.key", "--manifest", str(run_dir / "run.manifest"), "--token", boot_token
    )
    try:
        key, token = _volunteer(tmp_path, run_dir, "b")
        live = maddrs[0]
        assert "is not a join token" in _refusal(tmp_path, live, key, "garbage123")
        i = len(token) - 10
        changed = token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1 :]
        assert f"--token has a bad signature: its character {i + 1}" in _refusal(tmp_path, live, key, changed)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dead = re.sub(r"/tcp/\d+/", f"/tcp/{port}/", live)
        assert f"nothing listens at 127.0.0.1:{port}" in _refusal(tmp_path, dead, key, token)
        # the bootstrap's address with the volunteer's own peer ID: a peer listens, not that one
        wrong_id = live.rsplit("/", 1)[0] + "/" + _volunteer_id(tmp_path)
        line = _refusal(tmp_path, wrong_id, key, token)
        assert "a peer listens at 127.0.0.1:" in line and "does not answer there" in line, line
    finally:
        boot.terminate(grace=5.0)


def _volunteer_id(tmp: Path) -> str:
    from peers.keys.identity import ensure_identity

    return ensure_identity(tmp / "b.key")
