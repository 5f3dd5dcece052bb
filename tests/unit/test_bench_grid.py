"""The grid, Pareto front and table of ``swarmtrain bench strategies`` (pure logic, no training)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from swarmtrain.app.bench.strategies import (
    REFERENCE,
    Grid,
    _compare,
    grid_points,
    markdown_table,
    pareto,
    parse_sweep,
    table_lines,
    write_outputs,
)
from swarmtrain.core.errors import ConfigError


def test_reference_first_and_every_distinct_point_once() -> None:
    grid = Grid(
        strategies=("diloco", "demo", "data_parallel"),
        codecs=("int8", "ternary"),
        inner_steps=(10, 30),
        outer_lrs=(1.0,),
        outer_momenta=(0.0, 0.9),
    )
    points = grid_points(grid)
    assert points[0].label == REFERENCE
    assert points[0].overrides == {
        "strategy.name": "data_parallel",
        "compression.codec": "none",
        "compression.error_feedback": "none",
    }
    labels = [p.label for p in points]
    assert len(labels) == len(set(labels))
    # diloco: 2 codecs x 2 H x 1 lr x 2 momenta; demo: codec, H and the outer step do not apply
    assert len([p for p in points if p.strategy == "diloco"]) == 8
    assert [p.label for p in points if p.strategy == "demo"] == ["demo"]
    one = next(p for p in points if p.label == "diloco ternary H=10 outer=1/0.9")
    assert one.overrides == {
        "strategy.name": "diloco",
        "compression.codec": "ternary",
        "strategy.inner_steps": 10,
        "strategy.outer_lr": 1.0,
        "strategy.outer_momentum": 0.9,
    }


def test_unset_settings_add_nothing_to_the_label() -> None:
    points = grid_points(Grid(strategies=("streaming_diloco",), codecs=("int4",)))
    assert [p.label for p in points] == [REFERENCE, "streaming_diloco int4"]
    assert points[1].overrides == {"strategy.name": "streaming_diloco", "compression.codec": "int4"}


def test_unknown_strategy_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown strategy 'swarm'"):
        grid_points(Grid(strategies=("swarm",)))


def _rows(*points: tuple[str, float, float]) -> list[dict[str, Any]]:
    return [
        {"label": label, "final_val_loss": loss, "bytes_per_token": b, "params_identical": True}
        for label, loss, b in points
    ]


def test_pareto_front_keeps_only_points_nobody_beats_on_both() -> None:
    rows = _rows(("dp", 2.0, 1000.0), ("a", 2.1, 10.0), ("b", 2.2, 20.0), ("c", 2.3, 5.0), ("d", 2.1, 10.0))
    # b loses to a on both; a and d tie (neither strictly better), both stay
    assert pareto(rows) == {"dp", "a", "c", "d"}


def test_gap_reduction_and_table_fit_80_columns() -> None:
    rows = _rows(
        (REFERENCE, 2.0, 1600.0),
        ("streaming_diloco ternary H=100 outer=0.7/0.9 ef=ef", 2.06, 4.0),
        ("diloco int8 H=30", 2.1, 16.0),
    )
    _compare(rows)
    assert rows[0]["gap_vs_dp"] == 0 and rows[0]["reduction_vs_dp"] == 1
    assert rows[1]["gap_vs_dp"] == pytest.approx(0.03) and rows[1]["reduction_vs_dp"] == pytest.approx(400)
    assert rows[2]["pareto"] is False and rows[1]["pareto"] is True
    lines = table_lines(rows)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert any("+3.00%" in line and "400x" in line for line in lines)


def test_sweeps_cross_only_the_strategies_they_apply_to() -> None:
    """``--sweep``: a strategy prefix limits a sweep to that strategy, a ``strategy.*`` field to the
    strategies that have it; values read as TOML would; the reference is never swept."""
    grid = Grid(
        strategies=("streaming_diloco", "demo"),
        codecs=("int4",),
        sweeps=(
            parse_sweep("demo:train.lr=3e-4,1e-3"),
            parse_sweep("strategy.demo_topk=4,8"),
            parse_sweep("strategy.mixing=0.3,0.5"),
            parse_sweep("strategy.demo_sign=false"),
        ),
    )
    points = grid_points(grid)
    assert points[0].label == REFERENCE and "train.lr" not in points[0].overrides
    streaming = [p for p in points if p.strategy == "streaming_diloco"]
    demo = [p for p in points if p.strategy == "demo"]
    assert [p.label for p in streaming] == [
        "streaming_diloco int4 mixing=0.3",
        "streaming_diloco int4 mixing=0.5",
    ]
    assert len(demo) == 4 and all("mixing" not in p.label for p in demo)
    one = next(p for p in demo if p.label == "demo lr=0.0003 demo_topk=8 demo_sign=false")
    assert one.overrides == {
        "strategy.name": "demo",
        "train.lr": 0.0003,
        "strategy.demo_topk": 8,
        "strategy.demo_sign": False,
    }


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("strategy.mixing", "expected [STRATEGY:]SECTION.FIELD=V1,V2"),
        ("mixing=0.3", "expected [STRATEGY:]SECTION.FIELD=V1,V2"),
        ("strategy.mixing=", "expected [STRATEGY:]SECTION.FIELD=V1,V2"),
        ("demo:strategy.mixing=0.3", "applies to none of the swept strategies"),
        ("strategy.mixng=0.3", "applies to none of the swept strategies"),
    ],
)
def test_a_sweep_that_cannot_apply_is_one_clear_error(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        grid_points(Grid(strategies=("demo", "diloco"), sweeps=(parse_sweep(text),)))


def test_every_codec_point_of_an_outer_strategy_gets_one_fp32_control_before_it() -> None:
    grid = Grid(
        strategies=("diloco", "streaming_diloco", "demo"),
        codecs=("int8", "ternary", "none"),
        inner_steps=(4,),
        error_feedback=("none", "ef"),
        controls=True,
    )
    points = grid_points(grid)
    labels = [p.label for p in points]
    assert len(labels) == len(set(labels))
    assert labels[:4] == [
        REFERENCE,
        "diloco fp32 H=4 ef=none",
        "diloco int8 H=4 ef=none",
        "diloco int8 H=4 ef=ef",
    ]
    control = points[1]
    assert control.overrides == {
        "strategy.name": "diloco",
        "compression.codec": "none",
        "strategy.inner_steps": 4,
        "compression.error_feedback": "none",
    }
    by = {p.label: p for p in points}
    assert by["diloco int8 H=4 ef=ef"].control == "diloco fp32 H=4 ef=none"
    assert by["streaming_diloco ternary H=4 ef=none"].control == "streaming_diloco fp32 H=4 ef=none"
    # the codec "none" point is its own control; DeMo sends its own payload: no control
    assert by["diloco fp32 H=4 ef=none"].control is None and by["demo"].control is None
    assert by["diloco fp32 H=4 ef=ef"].control is None  # asked for (codec none x ef), not a control
    assert not any(p.control for p in grid_points(Grid(codecs=("int8",))))  # off unless asked


def _seeded_rows() -> list[dict[str, Any]]:
    rows = _rows((REFERENCE, 2.0, 1600.0), ("diloco fp32 H=4", 2.1, 400.0), ("diloco int8 H=4", 2.1, 100.0))
    losses = ([2.0, 2.2, 1.8], [2.1, 2.31, 1.89], [2.142, 2.31, 1.9089])
    for r, vals in zip(rows, losses, strict=True):
        r.update(val_losses=vals, data_seeds=[0, 1, 2], final_val_loss=sum(vals) / 3, seeds=3)
        r["val_loss_ci95"] = 0.25
    rows[2]["control"] = "diloco fp32 H=4"
    return rows


def test_gaps_are_paired_by_seed_and_split_into_the_strategys_and_the_codecs_part() -> None:
    rows = _seeded_rows()
    _compare(rows)
    # every seed of the control is 5 % above the same seed of DataParallel: no spread at all
    assert rows[1]["gap_vs_dp"] == pytest.approx(0.05) and rows[1]["gap_vs_dp_ci95"] == pytest.approx(0)
    assert rows[2]["gap_vs_control"] == pytest.approx(0.01) and rows[2]["gap_vs_control_ci95"] > 0
    assert "gap_vs_control" not in rows[1]
    lines = table_lines(rows)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert any("vs its fp32 control" in line and "+1.00%±" in line for line in lines)
    assert any(line.startswith("±: half-width of the 95 % t-interval over 3 seeds") for line in lines)
    md = markdown_table(rows)
    assert "vs fp32 control" in md[0] and all(line.count("|") == md[0].count("|") for line in md)


def test_one_seed_writes_null_intervals_strict_json_csv_and_both_plots(tmp_path: Path) -> None:
    rows = _rows((REFERENCE, 2.0, 1600.0), ("diloco int8 H=4", float("nan"), 100.0))
    curve = [{"step": 4, "tokens": 1024, "bytes": 5e5, "val_loss": 4.0, "val_loss_ci95": None}]
    for r in rows:
        r.update(val_loss_ci95=None, seeds=1, curve=curve)
    _compare(rows)
    meta = {"workers": 2, "steps": 8, "batch_size": 4, "preset": "tiny", "seeds": 1}
    written = write_outputs(rows, meta, tmp_path / "g.json")
    text = (tmp_path / "g.json").read_text(encoding="utf-8")
    assert "NaN" not in text and json.loads(text)["rows"][0]["val_loss_ci95"] is None
    assert [p.name for p in written] == ["g.json", "g.csv", "g.png", "g_curves.png"]
    assert "curve" not in (tmp_path / "g.csv").read_text(encoding="utf-8").splitlines()[0].split(",")
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written[2:])


def test_seed_k_reseeds_only_codecs_with_random_draws() -> None:
    from swarmtrain.app.bench.strategies import load_point, seeded

    ternary = load_point(None, {"compression.codec": "ternary"}, env={})
    assert seeded(ternary, 0) is ternary  # seed 0: the config's own run
    assert seeded(ternary, 2).compression.options == {"seed": ternary.train.seed + 2}
    int8 = load_point(None, {"compression.codec": "int8"}, env={})
    assert seeded(int8, 2) is int8  # deterministic: nothing to seed
