"""``swarmtrain bench codecs`` and the compare example: they run, print every codec and write JSON/PNG."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from compression.benchmark import DEFAULT_CODECS
from swarmtrain.app.cli import run
from swarmtrain.app.commands.bench import (
    DEFAULT_LLC_BYTES,
    cache_warning,
    codec_table,
    last_level_cache_bytes,
    mark_above,
)

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


def test_compare_example_names_the_file_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out X`` (no image suffix) writes ``X.png``, and says so."""
    src = tmp_path / "codecs.json"
    assert (
        run(["bench", "codecs", "--size", "4096", "--reps", "1", "--codec", "int8", "--json", str(src)]) == 0
    )
    capsys.readouterr()
    stem = tmp_path / "plot"
    monkeypatch.setattr(sys, "argv", ["compare_compressors.py", "--from-json", str(src), "--out", str(stem)])
    runpy.run_path(str(ROOT / "examples" / "compare_compressors.py"), run_name="__main__")
    assert not stem.exists() and (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
    assert capsys.readouterr().out.strip().splitlines()[-2:] == [
        f"wrote {tmp_path / 'plot.png'}",
        f"wrote {tmp_path / 'plot.json'}",
    ]


def _fake_cache(root: Path, cpu: int, index: int, level: int, kind: str, size: str, shared: str) -> None:
    d = root / f"cpu{cpu}" / "cache" / f"index{index}"
    d.mkdir(parents=True)
    for name, text in (("level", str(level)), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (d / name).write_text(text + "\n")


def test_last_level_cache_sums_the_slices(tmp_path: Path) -> None:
    """Two L3 slices (each shared by two cpus) count once each; L1i/L2 do not count."""
    for cpu in range(4):
        _fake_cache(tmp_path, cpu, 0, 1, "Instruction", "32K", str(cpu))
        _fake_cache(tmp_path, cpu, 2, 2, "Unified", "1024K", str(cpu))
        _fake_cache(tmp_path, cpu, 3, 3, "Unified", "32768K", "0-1" if cpu < 2 else "2-3")
    assert last_level_cache_bytes("cpu", tmp_path) == 64 << 20
    assert last_level_cache_bytes("cpu", tmp_path / "none") == DEFAULT_LLC_BYTES


def test_cache_warning_says_when_fractions_measure_the_cache() -> None:
    small = cache_warning(4_000_000, 32 << 20, {"none": 6.14, "ternary": 1.45})
    assert small is not None and "\n" not in small
    for needle in (
        "--size 4,000,000",
        "15 MiB",
        "32 MiB last-level cache",
        "none 6.14, ternary 1.45",
        "33554432",
    ):
        assert needle in small, small
    assert mark_above(4_000_000, 32 << 20) == 1.0 and mark_above(1 << 26, 32 << 20) > 1.05
    big = cache_warning(1 << 26, 32 << 20, {"none": 1.25})
    assert big is not None and "above 1 beyond timing noise (none 1.25)" in big and "cache" not in big
    assert cache_warning(1 << 26, 32 << 20, {}) is None


def test_bench_codecs_warns_below_the_cache(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["bench", "codecs", "--size", "4096", "--reps", "1", "--codec", "int8"]) == 0
    err = capsys.readouterr().err
    assert "warning: --size 4,096 is 0 MiB of float32, under twice the" in err


def test_codec_table_fits_80_columns() -> None:
    """The widest cells there are (a long codec name, a fraction above 1 marked ``!``) at 80 columns."""
    fields = {
        "bits_per_element": 32.0,
        "rel_l2_error": 1.25,
        "compress_gbps": 1234.56,
        "decompress_gbps": 999.99,
        "compress_roofline": 6.14,
        "decompress_roofline": 12.5,
        "copy_rw_gbps": 9.9,
    }
    results = [SimpleNamespace(codec=name, **fields) for name in (*DEFAULT_CODECS, "ternary+ef21")]
    console = Console(width=80, record=True, color_system=None)
    console.print(codec_table(results, 4_000_000, "cuda:0"))  # type: ignore[arg-type]
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text and "..." not in text
    for cell in ("ternary+ef21", "1234.56", "6.14!", "12.50!", "1.25e+00", "decompress", "roofline"):
        assert cell in text, cell


def test_the_default_size_is_the_smallest_out_of_the_cache() -> None:
    """``bench codecs`` without ``--size`` measures memory, not the cache, in seconds: 16M elements
    (64 MiB) for a 32 MiB cache, at least 4M, at most the old 64M default."""
    from swarmtrain.app.bench.codecs import default_size, in_cache

    assert default_size(32 << 20) == 1 << 24 and not in_cache(1 << 24, 32 << 20)
    assert in_cache((1 << 24) // 2, 32 << 20)
    assert default_size(1 << 20) == 1 << 22 and default_size(1 << 32) == 1 << 26
