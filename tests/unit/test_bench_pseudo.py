"""``bench codecs --from-run``: codec error on captured DiLoCo pseudo-gradients, with and without
error feedback, and the capture itself (a short in-process DiLoCo run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from swarmtrain.app.bench.pseudo import capture, load_rounds, measure
from swarmtrain.app.cli import run
from swarmtrain.core.config import load_config


def _rounds(tmp_path: Path, n: int = 6) -> Path:
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(64, 96, generator=g), "b": torch.randn(300, generator=g)}
    for i in range(n):  # consecutive rounds point the same way, as an outer step's do
        r = {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in base.items()}
        save_file(r, str(tmp_path / f"round-{i:04d}.safetensors"))
    return tmp_path


def test_error_feedback_bounds_the_error_of_the_sum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pg.json"
    (tmp_path / "run").mkdir()
    src = _rounds(tmp_path / "run")
    args = [
        "bench",
        "codecs",
        "--from-run",
        str(src),
        "--codec",
        "int4",
        "--codec",
        "none",
        "--json",
        str(out),
    ]
    assert run(args) == 0
    printed = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 80 for line in printed) and any(line.startswith("int4") for line in printed)
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["rounds"] == 6 and doc["numel"] == 64 * 96 + 300
    int4, none = doc["rows"]
    assert none["round_error"] == 0 and none["sum_error_ef"] == 0 and none["bits_per_element"] == 32
    assert 4 < int4["bits_per_element"] < 4.5
    # without EF each round's rounding error adds up; with EF what a round drops is sent later
    assert int4["sum_error_ef"] < 0.5 * int4["sum_error"]  # 0.41x at 6 rounds
    assert int4["round_error_ef"] >= int4["round_error"] * 0.5


def test_the_per_round_error_is_the_codecs_round_trip(tmp_path: Path) -> None:
    rounds = load_rounds(_rounds(tmp_path, 2))
    x = rounds[0]
    got = measure([x], "int8", error_feedback=False)["round_error"]
    from compression import make_codec

    c = make_codec("int8")
    err = sum(
        float((t - c.decompress(c.compress(t, key=k)).reshape(t.shape)).pow(2).sum()) for k, t in x.items()
    )
    assert got == pytest.approx((err / sum(float(t.pow(2).sum()) for t in x.values())) ** 0.5, rel=1e-6)


def test_bad_run_folders_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["bench", "codecs", "--from-run", str(tmp_path)]) == 2
    assert "no round-*.safetensors" in capsys.readouterr().err
    (tmp_path / "round-0000.safetensors").write_bytes(b"\x80\x04not safetensors")
    assert run(["bench", "codecs", "--from-run", str(tmp_path)]) == 2
    assert "not a safetensors file" in capsys.readouterr().err
    assert run(["bench", "codecs", "--capture"]) == 2
    assert "--capture needs --from-run" in capsys.readouterr().err


def test_capture_saves_worker_0s_pseudo_gradient_of_every_sync(tmp_path: Path) -> None:
    overrides = {
        "strategy.name": "diloco",
        "compression.codec": "none",
        "strategy.inner_steps": 4,
        "train.steps": 8,
        "train.batch_size": 4,
        "train.eval_batches": 1,
        "train.eval_interval": 10_000,
    }
    paths = capture(load_config(None, overrides, env={}), 2, tmp_path)
    assert [p.name for p in paths] == ["round-0000.safetensors", "round-0001.safetensors"]
    rounds = load_rounds(tmp_path)
    assert all(float(t.abs().sum()) > 0 for t in rounds[0].values())
    assert json.loads((tmp_path / "run.json").read_text())["rounds"] == 2
