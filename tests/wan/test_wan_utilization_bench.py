"""Opt-in (``SWARMTRAIN_WAN=1``, root): ``benchmarks/wan_utilization.py --quick`` runs
``swarmtrain simulate --topology`` for DataParallel and DiLoCo over the three emulated regions and
writes consistent rows (utilization in (0, 1], rounds, bytes, losses; DataParallel syncs every step,
so it commits more rounds and sends more than DiLoCo), the PNG and an 80-column table. The utilization
figures themselves are speed claims: they live in the JSON, not in asserts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarmtrain.simulation.regions import leftover_namespaces

pytestmark = [
    pytest.mark.wan,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and tc need root (euid 0)"),
]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "wan_utilization.py"


@pytest.mark.timeout(900)
def test_wan_utilization_quick_writes_consistent_rows(tmp_path: Path) -> None:
    out = tmp_path / "wu.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert leftover_namespaces() == []
    text = out.read_text()
    assert "NaN" not in text and "Infinity" not in text
    doc = json.loads(text)
    assert doc["settings"]["quick"] is True and doc["settings"]["peers"] == 3
    assert all("--topology examples/topologies/three_regions.toml" in c for c in doc["commands"])
    dp, dl = doc["rows"]
    assert (dp["strategy"], dl["strategy"]) == ("data_parallel", "diloco")
    for r in (dp, dl):
        assert r["rc"] == 0 and r["params_identical"] is True
        assert 0.0 < r["compute_utilization"] <= 1.0
        assert r["rounds_committed"] >= 1 and r["wait_per_round_s"] > 0
        assert r["bytes_sent_per_peer"] > 0 and r["final_val_loss"] > 0
        assert r["regions"] == {"us-east": [0], "eu-west": [1], "ap-south": [2]}
    # 20 steps: DataParallel syncs every step, DiLoCo (H=10) twice
    assert dp["rounds_committed"] > dl["rounds_committed"]
    assert dp["bytes_sent_per_peer"] > dl["bytes_sent_per_peer"]
    table = [line for line in proc.stdout.splitlines() if not line.startswith("wrote ")]
    assert any(line.startswith("data_parallel ") for line in table)
    assert all(len(line) <= 80 for line in table), proc.stdout
    assert out.with_suffix(".png").stat().st_size > 0
    assert doc["settings"]["runs"] == 1 and [e["strategy"] for e in doc["summary"]] == [
        "data_parallel",
        "diloco",
    ]
    for e, r in zip(doc["summary"], (dp, dl), strict=True):
        assert e["runs"] == 1 and e["compute_utilization"] == r["compute_utilization"]
        assert e["compute_utilization_range"] == [r["compute_utilization"]] * 2
