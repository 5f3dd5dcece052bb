"""Pure-logic checks of ``benchmarks/diloco.py``: row selection, the comparison columns and the table.

The rows here are synthetic inputs to the formatting code (no training happens); the benchmark's
measured figures live in ``benchmarks/results/diloco.json``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "diloco.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_diloco", _PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_diloco"] = mod
    spec.loader.exec_module(mod)
    return mod


bench = _load()


def _row(key: str, strategy: str, codec: str, h: int | None, loss: float, bpt: float) -> dict[str, Any]:
    return {
        "key": key,
        "strategy": strategy,
        "compressor": codec,
        "inner_steps": h,
        "outer_steps_planned": None if h is None else 300 // h,
        "final_val_loss": loss,
        "bytes_per_token": bpt,
        "params_identical": True,
        "wall_s": 100.0,
    }


def test_grid_runs_dataparallel_first_and_covers_every_codec_and_h() -> None:
    keys = [s.key for s in bench.grid()]
    assert keys[0] == "dp"
    assert len(keys) == 10 and len(set(keys)) == 10
    assert {f"{c}-{h}" for c in ("none", "int8", "ternary") for h in (10, 50, 100)} <= set(keys)


def test_select_accepts_fp32_alias_keeps_grid_order_and_rejects_unknown() -> None:
    chosen = bench.select(bench.grid(), "int8-50, fp32-10,dp")
    assert [s.key for s in chosen] == ["dp", "none-10", "int8-50"]
    assert chosen[1].overrides() == {
        "strategy.name": "diloco",
        "compression.codec": "none",
        "strategy.inner_steps": 10,
    }
    with pytest.raises(SystemExit):
        bench.select(bench.grid(), "int4-10")


def test_comparisons_and_table_against_the_dataparallel_row() -> None:
    rows = [
        _row("dp", "data_parallel", "none", None, 2.0, 2000.0),
        _row("int8-100", "diloco", "int8", 100, 2.1, 5.0),
    ]
    bench.add_comparisons(rows)
    assert rows[0]["loss_vs_dp"] == 0.0 and rows[0]["bytes_reduction_vs_dp"] == 1.0
    assert rows[1]["loss_vs_dp"] == pytest.approx(0.05)
    assert rows[1]["bytes_reduction_vs_dp"] == pytest.approx(400.0)
    doc = {
        "peers": 4,
        "shared_settings": {"train.steps": 300, "train.batch_size": 16, "train.seed": 0},
        "rows": rows,
        "not_run": ["ternary-100"],
    }
    text = bench.format_table(doc)
    line = next(ln for ln in text.splitlines() if ln.startswith("diloco"))
    assert "int8" in line and "+5.00%" in line and "400x" in line
    assert "fewer than 5 outer steps" in text  # H=100 over 300 steps: 3 outer steps, said aloud
    assert "Not run in this invocation: ternary-100" in text


def test_no_dataparallel_row_leaves_comparisons_empty() -> None:
    rows = [_row("none-10", "diloco", "none", 10, 2.0, 80.0)]
    bench.add_comparisons(rows)
    assert rows[0]["loss_vs_dp"] is None and rows[0]["bytes_reduction_vs_dp"] is None
    assert "n/a" in bench.format_table(
        {
            "peers": 4,
            "shared_settings": {"train.steps": 300, "train.batch_size": 16, "train.seed": 0},
            "rows": rows,
        }
    )
