"""``benchmarks/gpu.py --device cpu``: every section runs at its smallest sizes and the JSON is complete.

Takes 65-130 s on 2 busy cores (two real peer processes for the DiLoCo section, under the
integration lock), so it is marked ``slow``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("local_loop", "codecs", "dct", "diloco_2proc", "memory")


def _no_nan(text: str) -> None:
    def refuse(name: str) -> float:
        raise AssertionError(f"non-finite number {name} in the JSON")

    json.loads(text, parse_constant=refuse)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpu_script_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_cpu.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--device", "cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    _no_nan(text)
    rec = json.loads(text)
    assert set(SECTIONS) <= set(rec["sections"])
    for name in SECTIONS:
        assert rec["sections"][name]["status"] == "measured", (name, rec["sections"][name])
    assert rec["sections"]["local_loop"]["runs"]["eager"]["ratio_trainer_over_minimal"] > 0
    assert {"none", "int8", "ternary"} <= set(rec["sections"]["codecs"]["results"])
    assert rec["sections"]["dct"]["roundtrip_rel_error"] < 1e-4
    assert rec["sections"]["diloco_2proc"]["params_identical"] is True
    rows = rec["sections"]["memory"]["rows"]
    assert rows and all(r["measured_bytes"] > 0 for r in rows)
    assert rec["sections"]["memory"]["volunteer_16gb"]["configs"]["diloco_8bit_cpu8"]["vs_fp32_diloco"] > 1


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
