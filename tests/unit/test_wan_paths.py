"""The WAN benchmarks' results name files relative to the repository, never the directory of the
machine that ran them (issue 36.4)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import wan  # noqa: E402


def _strings(x: Any) -> list[str]:
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for v in x.values() for s in _strings(v)]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return []


def test_shown_path_is_relative_inside_the_repository() -> None:
    assert wan.shown_path(wan.TOPOLOGY) == "examples/topologies/three_regions.toml"
    assert wan.shown_path(Path("/elsewhere/regions.toml")) == "/elsewhere/regions.toml"


def test_committed_wan_results_hold_no_absolute_repository_paths() -> None:
    for name in ("wan.json", "wan_utilization.json"):
        doc = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
        absolute = [s for s in _strings(doc) if str(ROOT) in s or s.startswith("/") and s.endswith(".toml")]
        assert not absolute, f"{name}: {absolute}"
        topology = doc.get("topology") or doc["settings"]["topology"]
        assert topology == "examples/topologies/three_regions.toml"
