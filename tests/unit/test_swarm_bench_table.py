"""The README's SWARM table is the committed ``benchmarks/results/swarm.json`` as
``benchmarks/swarm.py`` renders it (README figures come from the JSON a benchmark wrote)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _bench() -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_swarm", BENCH / "swarm.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_swarm"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_readme_swarm_table_is_the_committed_json() -> None:
    doc = json.loads((BENCH / "results" / "swarm.json").read_text(encoding="utf-8"))
    entry = doc["runs"]["current"]
    table = _bench().markdown_table(entry)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert table in readme, f"README's SWARM table differs from swarm.json; regenerate it:\n{table}"


def test_the_committed_runs_lost_nothing_and_kept_replicas_identical() -> None:
    entry = json.loads((BENCH / "results" / "swarm.json").read_text(encoding="utf-8"))["runs"]["current"]
    swarm = [r for r in entry["rows"] if not r["label"].startswith("diloco")]
    assert {r["per_stage"] for r in swarm} >= {1, 2, 3}
    assert {r["codec"] for r in swarm} >= {"none", "bf16", "int8"}
    assert any(r["kill_servers"] for r in swarm) and any(
        r["label"].startswith("diloco") for r in entry["rows"]
    )
    assert all(r["lost_microbatches"] == 0 and r["params_identical"] for r in swarm)


def test_readme_rebalancing_table_is_the_committed_json() -> None:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import swarm_rebalance

    entry = json.loads((BENCH / "results" / "swarm_rebalance.json").read_text(encoding="utf-8"))
    lines = swarm_rebalance.table_lines(entry)
    assert all(len(line) <= 80 for line in lines)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "\n".join(lines) in readme, "README's rebalancing table differs from swarm_rebalance.json"
    fixed31, moved, fixed22 = entry["rows"]
    assert len(moved["moves"]) == 1 and moved["servers_per_stage_end"] == [2, 2]
    assert moved["throughput_after_moves"] > moved["throughput_before_moves"]
    assert all(r["params_identical"] and r["lost_microbatches"] == 0 for r in entry["rows"])
    assert fixed31["servers_per_stage_end"] == [3, 1] and fixed22["servers_per_stage_end"] == [2, 2]
