"""Every strategy, a robust reducer with the owner check, and SWARM with the model on a device that
is not the host, in the CPU suite: real ``swarmtrain simulate`` runs (separate peer processes on
127.0.0.1) whose peers put the model on ``fakegpu``, an emulated accelerator
(``tests/devices/fakegpu.py``) that raises CUDA's ``Expected all tensors to be on the same device``
wherever a device tensor meets a host tensor.

A GPU user's first sync crashed because the butterfly reduced its own row (on the GPU) with the
decoded rows of the others (on the host); this test fails the same way on that code without a GPU.
Each run must exit 0 with every peer's (every stage replica's) parameters identical and every peer
reporting the emulated device.

The robust reducers share one path through the butterfly (the rows stacked on the device, the
weights beside them), which ``centered-clip-owner-check`` takes over real peers, its verifier's too;
that each reducer returns its aggregate on the stack's device, equal to the host's, is checked in
process for every registered reducer (``tests/unit/test_device_state.py``), at a fraction of the
cost of a peer run each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DEVICES = Path(__file__).resolve().parents[1] / "devices"
DEVICE = "fakegpu:0"

#: (id, simulate arguments, extra environment, slow)
CASES: list[tuple[str, list[str], dict[str, str], bool]] = [
    ("diloco-int8", ["-s", "diloco", "-H", "3", "--steps", "6"], {}, False),
    (
        "diloco-ef-cpu8-owner-check",
        ["-s", "diloco", "-H", "3", "--steps", "6", "--error-feedback", "ef", "--owner-check", "-n", "3"],
        {"SWARMTRAIN_STRATEGY__OUTER_STATE": "cpu8"},
        True,
    ),
    (
        "streaming-outer-cpu",
        ["-s", "streaming_diloco", "-H", "4", "--steps", "8"],
        {"SWARMTRAIN_STRATEGY__OUTER_STATE": "cpu"},
        True,
    ),
    ("demo", ["-s", "demo", "--steps", "4"], {}, True),
    (
        "data-parallel-ternary-ef",
        ["-s", "data_parallel", "--steps", "4", "--compressor", "ternary", "--error-feedback", "ef"],
        {},
        True,
    ),
    (
        "centered-clip-owner-check",
        ["-s", "diloco", "-H", "3", "--steps", "6", "-n", "3", "--reducer", "centered_clip", "--owner-check"],
        {},
        True,
    ),
]


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    path = [str(DEVICES)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env.update({"PYTHONPATH": os.pathsep.join(path), "SWARMTRAIN_TRAIN__DEVICE": "fakegpu", **extra})
    return env


def _simulate(tmp: Path, args: list[str], extra: dict[str, str]) -> dict:
    out = tmp / "sim.json"
    cmd = [
        sys.executable,
        "-m",
        "swarmtrain",
        "simulate",
        "--preset",
        "tiny",
        "-n",
        "2",
        *args,
        "--json",
        str(out),
        "--timeout",
        "400",
    ]
    res = subprocess.run(cmd, env=_env(extra), capture_output=True, text=True, timeout=500)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("args", "extra"),
    [pytest.param(a, e, id=i, marks=[pytest.mark.slow] if s else []) for i, a, e, s in CASES],
)
def test_strategies_and_reducers_run_on_a_device(
    tmp_path: Path, args: list[str], extra: dict[str, str]
) -> None:
    res = _simulate(tmp_path, args, extra)
    assert set(res["peer_devices"]) == {DEVICE} and len(res["peer_devices"]) == res["peers"]
    assert res["params_identical"] is True
    assert res["rounds_committed"] >= 1


@pytest.mark.timeout(600)
def test_swarm_stages_run_on_a_device(tmp_path: Path) -> None:
    """Two replicas per stage (their gradients are summed through the same all-reduce) and the int8
    codec between stages."""
    args = [
        "-s",
        "swarm",
        "--stages",
        "2",
        "-n",
        "4",
        "--steps",
        "6",
        "--batch-size",
        "8",
        "--activation-codec",
        "int8",
    ]
    res = _simulate(tmp_path, args, {})
    assert set(res["server_devices"].values()) == {DEVICE}, res["server_devices"]
    assert len(res["server_devices"]) == 4
    assert res["params_identical"] is True and res["lost_microbatches"] == 0
