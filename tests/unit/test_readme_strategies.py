"""The strategy tables of ``docs/benchmarks.md`` are the committed ``swarmtrain bench strategies``
JSON, as ``markdown_table`` renders it (the doc's figures come from JSON a benchmark wrote)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from swarmtrain.app.bench.strategies import markdown_table

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"


@pytest.mark.parametrize(
    "name",
    [
        "bench_strategies.json",
        "bench_outer.json",
        "bench_sweeps.json",
        "bench_sweeps_more.json",
        "bench_sweeps_demo.json",
    ],
)
def test_doc_table_is_the_committed_json(name: str) -> None:
    rows = json.loads((RESULTS / name).read_text(encoding="utf-8"))["rows"]
    doc_md = DOC.read_text(encoding="utf-8")
    table = "\n".join(markdown_table(rows))
    assert table in doc_md, f"docs/benchmarks.md's table differs from {name}; regenerate it:\n{table}"


def test_doc_long_run_table_and_goals_are_the_committed_json() -> None:
    """The long run's table and the goals its script judged (``benchmarks/long_run.py``)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from long_run import goal_lines
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    doc = json.loads((RESULTS / "long_run.json").read_text(encoding="utf-8"))
    doc_md = DOC.read_text(encoding="utf-8")
    assert doc["settings"]["steps"] == 600 and doc["settings"]["workers"] == 4
    assert "\n".join(markdown_table(doc["rows"])) in doc_md
    assert len(doc["goals"]) == 3
    for line in goal_lines(doc["goals"]):
        assert line in doc_md, line


def test_doc_goal_table_is_the_committed_three_seed_json() -> None:
    """Issue 32's done-when: the JSON behind the goal table carries >= 3 seeds per point, and the
    goals are judged on intervals (``benchmarks/results/long_run_seeds.json``)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from long_run import goal_lines
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    doc = json.loads((RESULTS / "long_run_seeds.json").read_text(encoding="utf-8"))
    doc_md = DOC.read_text(encoding="utf-8")
    assert doc["settings"]["seeds"] >= 3 and all(r["seeds"] >= 3 for r in doc["rows"])
    assert all(r["val_loss_ci95"] is not None and r["curve"] for r in doc["rows"])
    assert "\n".join(markdown_table(doc["rows"])) in doc_md
    assert "(1 seed)" not in " ".join(g.get("verdict", "") for g in doc["goals"])
    for line in goal_lines(doc["goals"]):
        assert line in doc_md, line
