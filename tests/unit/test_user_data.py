"""Issue 17, "your own data": ``--data`` on train, simulate and join, the header line naming the data,
and simulate's final table readable at 80 columns."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from swarmtrain.app.cli import run
from swarmtrain.app.commands.simulate import SimulateOptions, _table
from swarmtrain.app.data import describe_data
from swarmtrain.core.config import DataConfig


def test_describe_stdlib_says_built_in() -> None:
    assert describe_data(DataConfig()) == "data: Python standard library sources (built in, val 2%)"


def test_describe_text_folder_counts_files_and_bytes(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "a.txt").write_bytes(b"x" * 1024)
    (notes / "sub" / "b.md").write_bytes(b"y" * 1024)
    (notes / ".hidden").write_bytes(b"z" * 4096)  # the corpus skips it, so does the count
    line = describe_data(DataConfig(paths=[str(notes)], val_fraction=0.05))
    assert line == f"data: text from {notes} (2 files, 2.0 KiB, val 5%)"


def test_describe_tokens_and_missing_paths(tmp_path: Path) -> None:
    owt = tmp_path / "owt"
    owt.mkdir()
    (owt / "train.bin").write_bytes(b"\0" * 2048)
    (owt / "val.bin").write_bytes(b"\0" * 2)
    line = describe_data(DataConfig(paths=[str(owt)]))
    assert line.startswith(f"data: uint16 tokens from {owt} (2 files, 2.0 KiB, val from val.bin)")
    many = DataConfig(paths=["a.txt", "b.txt", "c.txt"], max_bytes=1 << 20)
    assert describe_data(many) == (
        "data: text from a.txt, b.txt and 1 more (0 files, 0 B, val 2%, first 1.0 MiB); "
        "missing: a.txt, b.txt, c.txt"
    )


def test_simulate_data_flag_feeds_the_config(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("hello\n")
    cfg = SimulateOptions(peers=2, data=[str(text)]).load_config()
    assert (cfg.data.source, cfg.data.paths) == ("text", [str(text)])
    assert SimulateOptions(peers=2).load_config().data.source == "stdlib"


def test_join_data_flag_feeds_the_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from swarmtrain.app.commands import join as join_mod

    seen: dict[str, Any] = {}
    monkeypatch.setattr(join_mod, "run_join", lambda _config, overrides, *_a, **_kw: seen.update(overrides))
    assert run(["join", "--data", "a.bin", "--data", "b.bin"]) == 0
    assert seen["data.paths"] == ["a.bin", "b.bin"]


@pytest.mark.parametrize("command", ["simulate", "join"])
def test_data_flag_errors_are_one_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run([command, "--data", "a.txt", "--data", "b.bin"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot mix .bin token files with text files" in err, err


def _result(**kw: Any) -> SimpleNamespace:
    base = {
        "peers": 16,
        "tokens": 2_457_600_000,
        "final_val_loss": 2.123456,
        "bytes_sent_per_peer": 1.5e12,
        "bytes_per_token": 12345.678,
        "params_identical": True,
        "rss_per_peer_mib": 123_456.7,
        "wall_s": 123_456.0,
    }
    return SimpleNamespace(**{**base, **kw})


def test_simulate_table_fits_80_columns_without_cutting() -> None:
    """The widest case simulate prints: clean run, attacked run and baseline, long names, big numbers."""
    rows = [
        ("streaming_diloco ternary clean", _result()),
        ("streaming_diloco ternary +16 intruders", _result(params_identical=False)),
        ("data_parallel fp32", _result()),
    ]
    console = Console(width=80, record=True, color_system=None)
    console.print(_table(rows))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text and "..." not in text
    cells = ("2,457,600,000", "2.1235", "1397.0 GiB", "12345.678", "123,457 MiB", "123,456 s", "NO")
    for value in (*cells, "intruders"):
        assert value in text, value
