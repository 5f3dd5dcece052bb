"""``swarmtrain simulate`` and ``run_simulation``: real peer processes on 127.0.0.1 training together."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from swarmtrain.core.config import Config, load_config
from swarmtrain.simulation.runner import run_simulation


def _cfg(**overrides: Any) -> Config:
    base: dict[str, Any] = {"train.eval_interval": 10_000, "train.log_interval": 5, "peers.min_peers": 2}
    base.update(overrides)
    return load_config(None, base, env={})


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


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_diloco_four_peers_within_3_percent_of_data_parallel_with_100x_fewer_bytes() -> None:
    """4 real peers, equal tokens: DiLoCo (ternary, H=10) sends >= 100x fewer bytes per token than
    fp32 DataParallel, all peers identical after every outer step, and its val loss within 3 % of
    DataParallel's.

    The setting comes from in-process sweeps (docs/decisions.md): at 16 sequences per worker the gap
    stays at 3.7-10 % whatever H, codec or outer momentum; it shrinks as the per-worker batch grows
    (DataParallel's 4x larger batch buys less), to about 3 % at 64 x 300 steps and 1.9 % at
    128 x 150 steps (the same tokens), with a stronger outer step than the paper's 0.7/0.9 (lr 1.0,
    Nesterov momentum 0.5: 30 or 15 outer steps are too few for momentum 0.9 to pay off)."""
    steps, h = 150, 10
    shared = {"train.steps": steps, "train.batch_size": 128}
    diloco = run_simulation(
        _cfg(
            **shared,
            **{
                "strategy.name": "diloco",
                "strategy.inner_steps": h,
                "strategy.outer_lr": 1.0,
                "strategy.outer_momentum": 0.5,
                "compression.codec": "ternary",
            },
        ),
        4,
        timeout=2400,
    )
    dp = run_simulation(
        _cfg(**shared, **{"strategy.name": "data_parallel", "compression.codec": "none"}),
        4,
        timeout=2400,
    )
    ratio = dp.bytes_per_token / diloco.bytes_per_token
    gap = diloco.final_val_loss / dp.final_val_loss - 1
    print(
        f"\nDiLoCo ternary H={h}: val loss {diloco.final_val_loss:.4f}, "
        f"{diloco.bytes_per_token:.3f} B/token; "
        f"DataParallel fp32: val loss {dp.final_val_loss:.4f}, {dp.bytes_per_token:.1f} B/token; "
        f"gap {gap:+.2%}, {ratio:.0f}x fewer bytes"
    )
    assert diloco.params_identical and dp.params_identical
    for o in diloco.outcomes:  # identical after every outer step, and every outer step committed
        assert o.committed_rounds == steps // h and o.failed_rounds == 0
    assert diloco.tokens == dp.tokens
    assert diloco.final_val_loss < 0.6 * math.log(256)  # the loss fell from ~5.5
    assert gap <= 0.03
    assert ratio >= 100
