"""``swarmtrain simulate --data``: the peers train on the user's text, and the header says so."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path


def test_simulate_trains_on_user_text(tmp_path: Path) -> None:
    """Text that alternates two bytes is learnt within ten steps (val loss far below the ~4 nats the
    stdlib sources reach there), so a low loss shows the peers read this file, not the stdlib."""
    data = tmp_path / "mine"
    data.mkdir()
    (data / "ab.txt").write_text("ab" * 100_000)
    out = tmp_path / "sim.json"
    argv = ["simulate", "--peers", "2", "--data", str(data), "--steps", "10", "-H", "5"]
    argv += ["--batch-size", "4", "--lr", "0.01", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "swarmtrain", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"data: text from {data} (1 file, 195.3 KiB, val 2%)" in proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80, proc.stdout
    assert "…" not in proc.stdout
    result = json.loads(out.read_text())
    assert result["params_identical"] is True
    assert math.isfinite(result["final_val_loss"]) and result["final_val_loss"] < 1.5
