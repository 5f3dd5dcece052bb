"""``examples/compare_compressors.py`` writes the numbers it plots as strict JSON beside its PNG."""

from __future__ import annotations

import csv
import json
import math
import runpy
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from compression.benchmark import CodecResult

ROOT = Path(__file__).resolve().parents[2]


def _result(codec: str, bits: float, err: float) -> CodecResult:
    return CodecResult(
        codec=codec,
        numel=4096,
        bits_per_element=bits,
        rel_l2_error=err,
        compress_s=1e-4,
        decompress_s=2e-4,
        compress_gbps=1.5,
        decompress_gbps=0.75,
        compress_roofline=0.1,
        decompress_roofline=0.05,
        copy_rw_gbps=15.0,
        compiled=False,
    )


def test_from_json_writes_the_plotted_numbers_beside_the_png(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [_result("none", 32.0, 0.0), _result("int8", 8.125, 0.004), _result("broken", 2.0, math.nan)]
    src = tmp_path / "codecs.json"
    src.write_text(json.dumps({"results": [asdict(r) for r in rows]}), encoding="utf-8")
    out = tmp_path / "figs" / "cmp.png"
    out.parent.mkdir()
    monkeypatch.setattr(sys, "argv", ["compare_compressors.py", "--from-json", str(src), "--out", str(out)])
    runpy.run_path(str(ROOT / "examples" / "compare_compressors.py"), run_name="__main__")

    assert out.read_bytes()[:4] == b"\x89PNG"
    side = tmp_path / "figs" / "cmp.json"
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"wrote {side}"
    text = side.read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text
    doc = json.loads(text)  # strict JSON: the standard library accepts it back
    assert doc["numel"] == 4096 and doc["title"].startswith("codecs on 4,096 float32 elements")
    by_codec = {p["codec"]: p for p in doc["points"]}
    assert list(by_codec) == ["none", "int8", "broken"]
    assert by_codec["none"]["rel_l2_error"] == 0.0 and by_codec["none"]["plotted_error"] == doc["error_floor"]
    assert by_codec["int8"]["bits_per_element"] == 8.125 and by_codec["int8"]["plotted_error"] == 0.004
    assert by_codec["int8"]["compress_gbps"] == 1.5 and by_codec["int8"]["decompress_gbps"] == 0.75
    assert by_codec["broken"]["rel_l2_error"] is None and by_codec["broken"]["plotted_error"] is None


def test_measured_run_writes_json_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without ``--from-json`` (a tiny ``--size``), and ``--out`` without a suffix: X.png and X.json."""
    stem = tmp_path / "tiny"
    monkeypatch.setattr(sys, "argv", ["compare_compressors.py", "--size", "4096", "--out", str(stem)])
    runpy.run_path(str(ROOT / "examples" / "compare_compressors.py"), run_name="__main__")
    assert (tmp_path / "tiny.png").read_bytes()[:4] == b"\x89PNG"
    doc = json.loads((tmp_path / "tiny.json").read_text(encoding="utf-8"))
    assert doc["numel"] == 4096 and {"none", "int8"} <= {p["codec"] for p in doc["points"]}
    assert all(p["bits_per_element"] > 0 for p in doc["points"])


def test_table_fits_80_columns_writes_csv_and_warns_above_the_roofline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wide = _result("topk+ternary+ef21", 32.0, 1.25)
    wide = CodecResult(**{**asdict(wide), "compress_gbps": 12345.67, "compress_roofline": 6.14})
    rows = [_result("none", 32.0, 0.0), wide, _result("int8", 8.125, math.inf)]
    src = tmp_path / "codecs.json"
    src.write_text(json.dumps({"results": [asdict(r) for r in rows]}), encoding="utf-8")
    out = tmp_path / "cmp.png"
    monkeypatch.setattr(sys, "argv", ["compare_compressors.py", "--from-json", str(src), "--out", str(out)])
    runpy.run_path(str(ROOT / "examples" / "compare_compressors.py"), run_name="__main__")
    printed = capsys.readouterr()
    table = printed.out.split("wrote")[0].rstrip().splitlines()
    assert max(len(line) for line in table) <= 80, "\n".join(table)
    assert any("12345.67" in line and "6.14!" in line for line in table)
    assert "warning: roofline fractions above 1 (topk+ternary+ef21 6.14)" in printed.err
    with (tmp_path / "cmp.csv").open(encoding="utf-8") as f:
        got = list(csv.DictReader(f))
    assert [r["codec"] for r in got] == ["none", "topk+ternary+ef21", "int8"]
    assert got[1]["compress_roofline"] == "6.14" and got[2]["rel_l2_error"] == ""


def test_a_measured_cache_sized_input_is_warned_about(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        sys, "argv", ["compare_compressors.py", "--size", "4096", "--out", str(tmp_path / "x")]
    )
    runpy.run_path(str(ROOT / "examples" / "compare_compressors.py"), run_name="__main__")
    err = capsys.readouterr().err
    assert "warning: --size 4,096 is 0 MiB of float32, under twice the" in err
    assert (tmp_path / "x.csv").exists()
