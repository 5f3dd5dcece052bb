"""The WAN benchmarks' results name files relative to the repository, never the directory of the
machine that ran them (issue 36.4)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

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


def _row(run: int, rate: float, codec: str, delay: bool, round_s: float, exchange: float) -> dict[str, Any]:
    return {
        "run": run,
        "rate_mbit": rate,
        "codec": codec,
        "delay": delay,
        "payload_bytes": 3.0e6,
        "rtt_max_ms_configured": 150.0 if delay else 0.0,
        "bound_s": 2.0,
        "tcp_all_to_all_s": 1.5 + run,
        "round_s_median": round_s,
        "round_over_bound": round_s / 2.0,
        "data_phase_over_bound": exchange / 2.0,
        "phases_s_median": {"group": 0.2 if delay else 0.05, "exchange": exchange},
        "failed_rounds": run,
    }


def test_the_summary_takes_medians_over_runs_and_counts_each_phases_round_trips() -> None:
    rows = [_row(r, 20.0, "none", True, 3.0 + r, 2.5 + 0.1 * r) for r in range(3)]
    rows += [_row(r, 20.0, "none", False, 2.0 + r, 2.0) for r in range(3)]
    rows += [_row(0, 20.0, "int8", True, 1.0, 0.7)]  # no control for int8: no round-trip counts
    by = {(e["codec"], e["delay"]): e for e in wan.summarize(rows)}
    e = by[("none", True)]
    assert e["runs"] == 3 and e["round_s"] == 4.0 and e["round_s_range"] == [3.0, 5.0]
    assert e["round_over_bound"] == 2.0 and e["round_over_bound_range"] == [1.5, 2.5]
    assert e["tcp_all_to_all_s"] == 2.5 and e["failed_rounds"] == 3
    assert e["phases_s"]["exchange"] == pytest.approx(2.6)
    # (2.6 - 2.0) / 0.150 round trips more than the control in the exchange, (0.2 - 0.05) / 0.150 in the group
    assert e["extra_rtts"] == pytest.approx({"group": 1.0, "exchange": 4.0})
    assert "extra_rtts" not in by[("none", False)] and "extra_rtts" not in by[("int8", True)]
    json.dumps(wan.summarize(rows), allow_nan=False)  # strict JSON


def test_the_utilization_summary_is_per_strategy_over_the_runs_that_exited_0() -> None:
    import wan_utilization

    def r(strategy: str, util: float, rc: int = 0) -> dict[str, Any]:
        return {
            "strategy": strategy,
            "rc": rc,
            "compute_utilization": util,
            "wait_per_round_s": 1.0 - util,
            "final_val_loss": 5.0,
            "bytes_sent_per_peer": 1e6,
            "params_identical": rc == 0,
        }

    rows = [r("diloco", 0.8), r("demo", 0.5), r("diloco", 0.9), r("diloco", 0.1, rc=1), r("diloco", 0.85)]
    dl, demo = wan_utilization.summarize(rows)
    assert (dl["strategy"], dl["runs"], dl["runs_failed"]) == ("diloco", 3, 1)
    assert dl["compute_utilization"] == 0.85 and dl["compute_utilization_range"] == [0.8, 0.9]
    assert dl["params_identical"] is True and demo["runs"] == 1
    json.dumps([dl, demo], allow_nan=False)
