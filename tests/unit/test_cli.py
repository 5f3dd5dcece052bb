"""``swarmtrain`` command line: one-line errors without tracebacks, a real short run, resume."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from swarmtrain import __version__
from swarmtrain.app.cli import run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def one_thread() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _one_error_line(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("swarmtrain: error: ")
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"swarmtrain {__version__}"
    assert run(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in (
        "--config",
        "--preset",
        "--steps",
        "--max-time",
        "--batch-size",
        "--lr",
        "--device",
        "--compile",
        "--data",
        "--out-dir",
        "--seed",
        "--resume",
        "--no-progress",
    ):
        assert flag in out, flag


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["train", "--bogus"], ("--bogus",)),
        (["train", "--lr", "-1"], ("train.lr", "greater than 0")),
        (["train", "--steps", "abc"], ("--steps",)),
        (["train", "--batch-size", "0"], ("train.batch_size",)),
        (["train", "--preset", "huge"], ("model.preset",)),
        (["train", "--config", "/nonexistent/run.toml"], ("does not exist",)),
        (["nosuchcommand"], ("nosuchcommand",)),
    ],
)
def test_bad_input_is_one_line(
    argv: list[str], needles: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) == 2
    _one_error_line(capsys, *needles)


def test_bad_config_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nlr = 1\n")
    assert run(["train", "-c", str(bad)]) == 2
    _one_error_line(capsys, "not valid TOML")
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[train]\nlearning_rate = 0.1\n")
    assert run(["train", "-c", str(unknown)]) == 2
    _one_error_line(capsys, "train.learning_rate")
    assert run(["train", "--data", "a.txt", "--data", "b.bin"]) == 2
    _one_error_line(capsys, "cannot mix")
    assert run(["train", "--resume", str(tmp_path / "no-checkpoint")]) == 1
    _one_error_line(capsys, "not a checkpoint")
    assert run(["train", "--data", str(tmp_path / "missing.txt")]) == 2
    _one_error_line(capsys, "does not exist")


def test_train_run_then_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(3000)))
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        "[model]\nn_layer = 1\nn_head = 2\nn_embd = 32\nblock_size = 32\n"
        "[train]\nbatch_size = 4\neval_batches = 2\nlog_interval = 2\nsteps = 100\n"
    )
    out_dir = tmp_path / "run"
    argv = [
        "train",
        "-c",
        str(cfg),
        "--data",
        str(text),
        "--steps",
        "4",
        "--out-dir",
        str(out_dir),
        "--no-progress",
        "--device",
        "cpu",
    ]
    assert run(argv) == 0
    out = capsys.readouterr().out
    assert "final train loss" in out and "val loss" in out
    assert str(out_dir / "metrics.jsonl") in out and (out_dir / "checkpoint" / "meta.json").is_file()
    # a bare --resume continues the saved run's config (data, model, out dir) to more steps
    assert run(["train", "--resume", str(out_dir / "checkpoint"), "--steps", "6", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "steps 4->6" in out and "step 6/6" in out


def test_subprocess_entry_points(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bad = subprocess.run(
        [sys.executable, "-m", "swarmtrain", "train", "--lr", "-1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stdout + bad.stderr
    assert bad.stderr.strip().splitlines() == [bad.stderr.strip()] and "train.lr" in bad.stderr
    env_bad = subprocess.run(
        [sys.executable, "-m", "swarmtrain", "train", "--no-progress"],
        capture_output=True,
        text=True,
        env={**env, "SWARMTRAIN_TRAIN__STEPS": "-5"},
        cwd=tmp_path,
        timeout=120,
    )
    assert env_bad.returncode == 2 and "train.steps" in env_bad.stderr and "Traceback" not in env_bad.stderr
