"""``swarmtrain bench strategies``: the in-process harness's grid, its outputs, and the same points
re-run with real peer processes on loopback agreeing with it."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from swarmtrain.app.bench.harness import run_in_process
from swarmtrain.core.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "swarmtrain", "bench", "strategies", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # 20-47 s: out of the quick loop
def test_grid_writes_json_csv_png_and_real_peers_agree_with_the_harness(tmp_path: Path) -> None:
    out = tmp_path / "grid.json"
    proc = _bench(
        "--workers", "2", "--steps", "12", "-H", "4", "--codec", "int8,ternary", "--real-peers", "1",
        "--no-controls", "--eval-batches", "8", "--json", str(out),
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


def test_seeds_give_intervals_curves_and_a_fp32_control_per_codec_row(tmp_path: Path) -> None:
    """The done-when command (``--seeds 3 --quick``), smaller: 2 seeds, 8 steps of 4 sequences."""
    out = tmp_path / "seeds.json"
    proc = _bench(
        "--seeds", "2", "--quick", "--steps", "8", "--batch-size", "4", "--eval-batches", "2",
        "--json", str(out), timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text(encoding="utf-8")
    assert "NaN" not in text
    data = json.loads(text)
    assert data["settings"]["seeds"] == 2 and data["settings"]["quick"] is True
    assert data["settings"]["eval_batches"] == 2 and "fewer than" in data["settings"]["eval_note"]
    rows = {r["label"]: r for r in data["rows"]}
    assert list(rows) == ["data_parallel fp32", "diloco fp32 H=4", "diloco int8 H=4"]
    assert rows["diloco int8 H=4"]["control"] == "diloco fp32 H=4"
    assert "gap_vs_control" in rows["diloco int8 H=4"]
    for r in rows.values():
        assert r["seeds"] == 2 and r["data_seeds"] == [0, 1] and len(r["val_losses"]) == 2
        assert r["val_loss_mean"] == r["final_val_loss"] and r["val_loss_ci95"] >= 0
        curve = r["curve"]
        assert curve[-1]["step"] == 8 and curve[-1]["val_loss"] == pytest.approx(r["val_loss_mean"])
        assert all(set(c) >= {"step", "tokens", "bytes", "val_loss"} for c in curve)
        pairs = zip(curve, curve[1:], strict=False)
        assert all(a["bytes"] < b["bytes"] and a["tokens"] < b["tokens"] for a, b in pairs)
    # DiLoCo's curve has a point at each of its 2 syncs (H=4 of 8 steps); the last is the end
    assert [c["step"] for c in rows["diloco int8 H=4"]["curve"]] == [4, 8]
    assert rows["diloco int8 H=4"]["curve"][0]["tokens"] == 2 * 4 * 4 * 128
    for name in ("seeds.csv", "seeds.png", "seeds_curves.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert all(len(line) <= 80 for line in proc.stdout.splitlines()), proc.stdout


def test_bad_grid_input_is_one_line_before_any_training(tmp_path: Path) -> None:
    for args, word in (
        (["--outer-lr", "fast"], "--outer-lr"),
        (["--strategy", "swarm"], "swarm"),
        (["--codec", "int9"], "int9"),
        (["--sweep", "train.lrr=1"], "train.lrr"),
        (["--sweep", "strategy.mixng=0.3"], "applies to none"),
        (["--sweep", "mixing"], "--sweep"),
        (["--seeds", "0"], "--seeds"),
        (["--link", "100mbit"], "--link"),
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
    if strategy == "streaming_diloco":  # the global (anchor) model's loss, not the mixed local ones'
        assert res.local_val_loss is not None and res.final_val_loss != res.local_val_loss
    else:
        assert res.local_val_loss is None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_readme_run_reproduces_the_benchmarked_gap_to_data_parallel() -> None:
    """The run of the README's first command (4 peers x 300 steps x 16 sequences, DiLoCo ternary at
    simulate's H=30 with the default outer step), in-process, reproduces the row of the committed
    benchmark (benchmarks/results/bench_strategies.json) that the README quotes: the same payload
    bytes exactly, the same loss within another CPU's floating point. That benchmark ran it beside
    fp32 DataParallel at equal tokens and per-worker batch: +2.7 % at 452x fewer bytes per token (the
    goal: 3 % at 100x). A change of the code or the defaults that moves the run fails here until the
    benchmark is re-run. (Re-running DataParallel here as well cost CI 2 more minutes of its 45.)"""
    from swarmtrain.app.bench.strategies import Grid, grid_points, run_grid, settings

    bench = json.loads((ROOT / "benchmarks" / "results" / "bench_strategies.json").read_text())
    point = grid_points(Grid(codecs=("ternary",)))[1]
    assert point.label == "diloco ternary"
    (row,) = run_grid({}, [point], 4)
    now = settings({}, 4, None, env={})
    for key in ("workers", "preset", "steps", "batch_size", "lr", "seed"):
        assert bench["settings"][key] == now[key], key
    dp = next(r for r in bench["rows"] if r["strategy"] == "data_parallel")
    point_keys = ("strategy", "codec", "error_feedback", "inner_steps", "outer_lr", "outer_momentum")
    (same,) = [r for r in bench["rows"] if all(r[k] == row[k] for k in point_keys)]
    print(f"README run: val loss {row['final_val_loss']:.4f} (benchmark {same['final_val_loss']:.4f},")
    print(f"  DataParallel {dp['final_val_loss']:.4f}), {row['bytes_per_token']:.2f} B/token")
    assert row["params_identical"] and row["rounds_failed"] == 0 and row["rounds_committed"] == 10
    assert row["bytes_per_token"] == same["bytes_per_token"]
    assert abs(row["final_val_loss"] / same["final_val_loss"] - 1) <= 0.01
    assert dp["bytes_per_token"] / row["bytes_per_token"] >= 400
    assert same["gap_vs_dp"] <= 0.03 and row["final_val_loss"] / dp["final_val_loss"] - 1 <= 0.035
