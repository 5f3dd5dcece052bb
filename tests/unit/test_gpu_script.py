"""``benchmarks/gpu.py --device cpu``: every section runs at its smallest sizes and the JSON is complete.

Takes 70-120 s on 2 busy cores (two real peer processes per strategy and a SWARM run), so it is
marked ``slow``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("strategies", "codecs", "swarm", "local_loop", "memory", "dct")
STRATEGIES = ("data_parallel", "diloco", "streaming_diloco", "demo")


def _no_nan(text: str) -> None:
    def refuse(name: str) -> float:
        raise AssertionError(f"non-finite number {name} in the JSON")

    json.loads(text, parse_constant=refuse)


def _table_width(rec: dict[str, Any]) -> int:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu
    finally:
        sys.path.pop(0)
    return max(len(line) for line in gpu.table(rec).splitlines())


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_gpu_script_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_cpu.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=460,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    _no_nan(text)
    rec = json.loads(text)
    assert rec["complete"] is True
    assert set(SECTIONS) <= set(rec["sections"])
    for name in SECTIONS:
        sec = rec["sections"][name]
        assert sec["status"] == "measured", (name, sec)
        assert isinstance(sec["goals"], dict) and "goals_met" in sec, name
    runs = rec["sections"]["strategies"]["runs"]
    for name in STRATEGIES:  # every strategy's real-peer run ends with identical parameters
        assert runs[name]["status"] == "measured", (name, runs[name])
        assert runs[name]["params_identical"] is True, (name, runs[name])
        assert runs[name]["bytes_sent_per_peer"] > 0, name
    assert rec["sections"]["strategies"]["goals_met"] is True
    sw = rec["sections"]["swarm"]
    assert sw["params_identical"] is True and sw["lost_microbatches"] == 0, sw
    assert sw["server_devices"] and set(sw["server_devices"].values()) == {"cpu"}, sw["server_devices"]
    assert sw["goals"]["stages_on_device"]["met"] is True
    assert rec["sections"]["local_loop"]["runs"]["eager"]["ratio_trainer_over_minimal"] > 0
    codecs = rec["sections"]["codecs"]
    assert {"int8", "ternary"} <= set(codecs.get("codecs") or codecs.get("results") or {}), codecs
    assert rec["sections"]["dct"]["roundtrip_rel_error"] < 1e-4
    rows = rec["sections"]["memory"]["rows"]
    assert rows and all(r["measured_bytes"] > 0 for r in rows)
    assert rec["sections"]["memory"]["volunteer_16gb"]["configs"]["diloco_8bit_cpu8"]["vs_fp32_diloco"] > 1
    assert _table_width(rec) <= 80


def test_memory_volunteer_arithmetic() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import memory
    finally:
        sys.path.pop(0)
    vol = memory.volunteer_16gb()
    cfgs = vol["configs"]
    assert cfgs["diloco_fp32"]["device_bytes_per_param"] == pytest.approx(32.0)  # 4+4+8+8 + 8 sync
    assert cfgs["diloco_offload"]["device_bytes_per_param"] == pytest.approx(24.0)  # outer state on host
    assert cfgs["diloco_fp32"]["vs_fp32_diloco"] == 1.0
    assert cfgs["diloco_8bit_cpu8"]["max_params"] > cfgs["diloco_offload"]["max_params"]
