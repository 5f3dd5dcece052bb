"""The README's SWARM quick start, its first step (issue 31.5): a stage server started with
``examples/swarm.toml`` and no ``--initial-peers`` prints the multiaddrs others join by, and a lone
server stops within 5 s of SIGTERM (a real process on 127.0.0.1)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from peer_helpers import LOOP, SWARMTRAIN, cli_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "swarm.toml"


@pytest.mark.timeout(300)
def test_a_lone_server_prints_its_multiaddrs_and_stops_within_5_s_of_sigterm() -> None:
    argv = [*SWARMTRAIN, "join", "--role", "server", "-c", str(EXAMPLE), *LOOP]
    env = cli_env({"SWARMTRAIN_TRAIN__THREADS": "1"}, keep_settings=False)
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        assert p.stdout is not None
        lines: list[str] = []
        for line in p.stdout:  # a hang guard: the test's timeout
            lines.append(line.rstrip())
            if "serving stage" in line:
                break
        maddrs = [x.strip() for x in lines if x.startswith("  /ip4/127.0.0.1/tcp/") and "/p2p/Qm" in x]
        assert maddrs and "multiaddrs (others pass one as --initial-peers)" in lines[0], lines
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        took = time.monotonic() - t0
        assert p.returncode == 0 and took < 5.0, (p.returncode, took)
        assert "server left: stage" in p.stdout.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
