"""``benchmarks/allreduce.py`` at smoke-test size, both sides as real processes on loopback: two
peers, one tiny vector, one timed round each. The hivemind side's matchmaking finishes (its own DHT,
the vote before the trigger), the ratio is measured in the same run, and the phases are recorded."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "allreduce.py"
_MATCHMAKING = re.compile(r"matchmak|group|averag|leader|declare|Traceback|Error", re.I)


def _matchmaking_lines(stderr: str) -> str:
    """The tail of the run's matchmaking and error lines (what a failure of the hivemind side shows;
    p2pd's own debug lines, which the same level turns on, are left out)."""
    lines = [ln[:240] for ln in stderr.splitlines() if _MATCHMAKING.search(ln) and ".go:" not in ln]
    return "\n" + "\n".join(lines)[-5000:]


@pytest.mark.timeout(300)
def test_allreduce_bench_measures_both_sides_in_one_run(tmp_path: Path) -> None:
    out = tmp_path / "allreduce.json"
    cmd = [sys.executable, str(SCRIPT), "--sizes", "64K", "--rounds", "1", "--peers", "2", "--json", str(out)]
    # hivemind's matchmaking at DEBUG: the side failed a few first runs in fresh environments (no
    # group found, attempt after attempt) and never here; its lines are what such a failure shows
    env = {**os.environ, "HIVEMIND_LOGLEVEL": "DEBUG"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env)
    why = _matchmaking_lines(proc.stderr)
    assert proc.returncode == 0, proc.stdout[-2000:] + why
    doc = json.loads(out.read_text())
    assert {k: (v["rows"], v["error"]) for k, v in doc["sides"].items()} == {
        "hivemind": (1, None),
        "swarmtrain": (2, None),
    }, why
    rows = {(r["impl"], r["codec"]): r for r in doc["rows"]}
    assert set(rows) == {("hivemind", "none"), ("swarmtrain", "none"), ("swarmtrain", "int8")}
    hm = rows[("hivemind", "none")]
    assert hm["rounds_measured"] == 1, json.dumps(hm)[:1500] + why
    assert hm["max_abs_err"] < 1e-5 and hm["matchmaking_retries"] >= 0
    for codec in ("none", "int8"):
        r = rows[("swarmtrain", codec)]
        assert r["rounds_measured"] == 1 and r["ratio_vs_hivemind_fp32"] > 0
        assert r["max_abs_err"] < (1e-6 if codec == "none" else 0.1)
        ph = r["phases"]
        assert {"group", "encode_parts", "exchange", "exchange.wait", "wait_sends", "agree"} <= set(
            ph["wall_s"]
        )
        assert set(ph["cpu_s_by_part"]) == {
            "caller_thread",
            "loop_thread",
            "other_threads",
            "p2pd",
            "dht_process",
        }
    assert out.with_suffix(".png").stat().st_size > 0
