"""``swarmtrain simulate``: real peer processes on 127.0.0.1 training together.

How close DiLoCo comes to DataParallel is measured with the in-process harness, which agrees with
real peers (``test_bench_strategies.py``), not with two long real-peer runs here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path


def test_simulate_cli_two_peers_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swarmtrain",
            "simulate",
            "--peers",
            "2",
            "--steps",
            "20",
            "-H",
            "10",
            "--compressor",
            "int8",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    for key in (
        "strategy",
        "compressor",
        "peers",
        "tokens",
        "final_val_loss",
        "baseline_val_loss",
        "bytes_sent_per_peer",
        "baseline_bytes_sent_per_peer",
        "params_identical",
        "wall_s",
    ):
        assert key in data
    assert data["strategy"] == "diloco" and data["compressor"] == "int8" and data["peers"] == 2
    assert data["admission"] == "token"  # its own run key and a token per peer, as run init makes
    assert data["params_identical"] is True
    # memory (PSS): a peer's tree holds at least torch and its model; the run holds both peers more
    assert 50 < data["rss_per_peer_mib"] < data["peak_rss_total_mib"], data
    assert data["peak_rss_total_mib"] >= 2 * data["rss_per_peer_mib"], data
    assert data["tokens"] == 2 * 20 * 16 * 128
    assert data["bytes_sent_per_peer"] > 0
    assert math.isfinite(data["final_val_loss"]) and data["final_val_loss"] < math.log(256)
    assert "Traceback" not in proc.stderr


def test_simulate_rejects_unknown_codec_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "swarmtrain", "simulate", "--compressor", "int9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "int9" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_simulate_refuses_a_reducer_beyond_its_breakdown_point_in_one_line() -> None:
    """centered_clip tolerating f=2 needs 5 peers: with 3, no round could commit (issue 17)."""
    cmd = [sys.executable, "-m", "swarmtrain", "simulate", "--peers", "3", "--reducer", "centered_clip"]
    proc = subprocess.run([*cmd, "--tolerate", "2"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "needs n >= 5" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
