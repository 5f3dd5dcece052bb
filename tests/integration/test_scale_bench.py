"""``benchmarks/scale.py --quick`` (issue 35, point 3): real ``swarmtrain simulate`` runs at two peer
counts and two codecs, at one token budget; every row has its memory, round time and bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _no_nan(text: str) -> None:
    def refuse(name: str) -> float:
        raise AssertionError(f"non-finite number {name} in the JSON")

    json.loads(text, parse_constant=refuse)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_scale_quick_measures_memory_rounds_and_bytes_per_peer_count(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = out.read_text()
    _no_nan(text)
    doc = json.loads(text)
    rows = doc["rows"]
    points = [(r["peers"], r["codec"]) for r in rows]
    assert points == [(2, "int8"), (3, "int8"), (2, "ternary"), (3, "ternary")]
    for r in rows:
        assert r["rc"] == 0 and r["params_identical"] is True, r
        assert 50 < r["rss_per_peer_mib"] < r["peak_rss_total_mib"], r
        assert r["s_per_round"] > 0 and r["rounds_committed"] >= 2 and r["bytes_sent_per_peer"] > 0, r
        assert r["wait_per_round_s"] > 0 and r["rounds_failed"] is not None, r
    # the same token budget at every peer count
    tokens = {(r["codec"], r["peers"]): r["tokens"] for r in rows}
    assert tokens[("int8", 2)] == tokens[("int8", 3)] == doc["settings"]["tokens"]
    # ternary sends fewer bytes than int8 at the same peers
    by = {(r["codec"], r["peers"]): r["bytes_sent_per_peer"] for r in rows}
    assert all(by[("ternary", n)] < by[("int8", n)] for n in (2, 3))
    table = proc.stdout[: proc.stdout.index("wrote ")]
    assert max(len(line) for line in table.splitlines()) <= 80
    assert out.with_suffix(".png").stat().st_size > 0
