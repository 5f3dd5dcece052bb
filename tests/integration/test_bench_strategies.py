"""``swarmtrain bench strategies``: the in-process harness's grid, its outputs, and the same points
re-run with real peer processes on loopback agreeing with it."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from swarmtrain.app.harness import run_in_process
from swarmtrain.core.config import load_config


def _bench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "swarmtrain", "bench", "strategies", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_grid_writes_json_csv_png_and_real_peers_agree_with_the_harness(tmp_path: Path) -> None:
    out = tmp_path / "grid.json"
    proc = _bench(
        "--workers", "2", "--steps", "12", "-H", "4", "--codec", "int8,ternary", "--real-peers", "1",
        "--json", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["label"] for r in rows][0] == "data_parallel fp32"
    assert {r["label"] for r in rows[1:]} == {"diloco int8 H=4", "diloco ternary H=4"}
    assert data["settings"]["workers"] == 2 and data["settings"]["steps"] == 12
    for r in rows:
        assert r["params_identical"] is True
        assert r["rounds_failed"] == 0
        assert r["rounds_committed"] == (12 if r["strategy"] == "data_parallel" else 3)
    assert rows[0]["gap_vs_dp"] == 0
    assert all(r["reduction_vs_dp"] > 10 for r in rows[1:])  # int8 at H=4 sends ~25x fewer bytes
    # the reference and the best point re-ran over real peers: same run, same numbers within noise
    real = [r for r in rows if "real_final_val_loss" in r]
    assert len(real) == 2 and real[0]["label"] == "data_parallel fp32"
    for r in real:
        print(f"{r['label']}: harness {r['final_val_loss']:.5f}, real peers {r['real_final_val_loss']:.5f}")
        assert r["real_params_identical"] is True
        assert abs(r["real_vs_harness"]) < 0.01
    with out.with_suffix(".csv").open(encoding="utf-8") as f:
        assert [r["label"] for r in csv.DictReader(f)] == [r["label"] for r in rows]
    assert out.with_suffix(".png").stat().st_size > 10_000
    table = proc.stdout.splitlines()
    assert any("diloco int8 H=4" in line for line in table)
    assert all(len(line) <= 80 for line in table), proc.stdout


def test_bad_grid_input_is_one_line_before_any_training(tmp_path: Path) -> None:
    for args, word in (
        (["--outer-lr", "fast"], "--outer-lr"),
        (["--strategy", "swarm"], "swarm"),
        (["--codec", "int9"], "int9"),
    ):
        proc = _bench(*args, "--json", str(tmp_path / "x.json"), timeout=120)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.strip().count("\n") == 0 and word in proc.stderr, proc.stderr
        assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("strategy", ["streaming_diloco", "demo"])
def test_harness_runs_every_synced_strategy_with_identical_workers(strategy: str) -> None:
    overrides = {"strategy.name": strategy, "train.steps": 12, "train.eval_interval": 10_000}
    if strategy == "streaming_diloco":
        overrides.update({"strategy.inner_steps": 4, "strategy.fragments": 2, "compression.codec": "int4"})
    res = run_in_process(load_config(None, overrides, env={}), 3)
    assert res.params_identical and res.rounds_failed == 0 and res.rounds_committed > 0
    assert res.tokens == 3 * 12 * 16 * 128
    assert 0 < res.final_val_loss < 6
