"""``swarmtrain bench codecs`` and the compare example: they run, print every codec and write JSON/PNG."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

from compression.benchmark import DEFAULT_CODECS
from swarmtrain.app.cli import run

ROOT = Path(__file__).resolve().parents[2]


def test_bench_codecs_writes_json_with_every_codec(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "codecs.json"
    assert run(["bench", "codecs", "--size", "8192", "--reps", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert [r["codec"] for r in doc["results"]] == list(DEFAULT_CODECS)
    for r in doc["results"]:
        assert r["codec"] in printed
        assert r["compress_gbps"] > 0 and r["decompress_gbps"] > 0 and r["copy_rw_gbps"] > 0
    bits = {r["codec"]: r["bits_per_element"] for r in doc["results"]}
    assert bits["none"] == 32 and bits["fp16"] == 16 and bits["int8"] == 8.125 and bits["ternary"] == 2.125
    assert doc["environment"]["torch"]


def test_bench_codecs_rejects_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["bench", "codecs", "--size", "10"]) == 2
    assert run(["bench", "codecs", "--size", "4096", "--codec", "zstd"]) == 2
    assert "zstd" in capsys.readouterr().err


def test_compare_example_draws_a_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "codecs.json"
    assert run(["bench", "codecs", "--size", "4096", "--reps", "1", "--json", str(src)]) == 0
    png = tmp_path / "plot.png"
    monkeypatch.setattr(sys, "argv", ["compare_compressors.py", "--from-json", str(src), "--out", str(png)])
    runpy.run_path(str(ROOT / "examples" / "compare_compressors.py"), run_name="__main__")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
