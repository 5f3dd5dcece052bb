"""The SWARM tables of ``docs/benchmarks.md`` are the committed ``benchmarks/results/swarm.json`` and
``swarm_rebalance.json`` as ``benchmarks/swarm.py`` and ``swarm_rebalance.py`` render them (the doc's
figures come from the JSON a benchmark wrote)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
DOC = ROOT / "docs" / "benchmarks.md"


def _bench() -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_swarm", BENCH / "swarm.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_swarm"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_doc_swarm_table_is_the_committed_json() -> None:
    doc = json.loads((BENCH / "results" / "swarm.json").read_text(encoding="utf-8"))
    entry = doc["runs"]["current"]
    table = _bench().markdown_table(entry)
    doc_md = DOC.read_text(encoding="utf-8")
    assert table in doc_md, (
        f"docs/benchmarks.md's SWARM table differs from swarm.json; regenerate it:\n{table}"
    )


def test_the_committed_runs_lost_nothing_and_kept_replicas_identical() -> None:
    entry = json.loads((BENCH / "results" / "swarm.json").read_text(encoding="utf-8"))["runs"]["current"]
    swarm = [r for r in entry["rows"] if not r["label"].startswith("diloco")]
    assert {r["per_stage"] for r in swarm} >= {1, 2, 3}
    assert {r["codec"] for r in swarm} >= {"none", "bf16", "int8"}
    assert any(r["kill_servers"] for r in swarm) and any(
        r["label"].startswith("diloco") for r in entry["rows"]
    )
    assert all(r["lost_microbatches"] == 0 and r["params_identical"] for r in swarm)


def test_doc_rebalancing_table_is_the_committed_json() -> None:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import swarm_rebalance

    entry = json.loads((BENCH / "results" / "swarm_rebalance.json").read_text(encoding="utf-8"))
    lines = swarm_rebalance.table_lines(entry)
    assert all(len(line) <= 80 for line in lines)
    doc_md = DOC.read_text(encoding="utf-8")
    assert "\n".join(lines) in doc_md, (
        "docs/benchmarks.md's rebalancing table differs from swarm_rebalance.json"
    )
    fixed31, moved, fixed22 = entry["rows"]
    assert len(moved["moves"]) == 1 and moved["servers_per_stage_end"] == [2, 2]
    assert moved["throughput_after_moves"] > moved["throughput_before_moves"]
    assert all(r["params_identical"] and r["lost_microbatches"] == 0 for r in entry["rows"])
    assert fixed31["servers_per_stage_end"] == [3, 1] and fixed22["servers_per_stage_end"] == [2, 2]
