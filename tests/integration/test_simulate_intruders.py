"""``swarmtrain simulate --intruders K --colluders C``: outsiders and admitted colluders attack a run.

Each intruder (``swarmtrain.simulation.outsider``) has its own identity but no join token and tries
every attack of issue 13 in a loop: unsigned and own-signed join/group records, junk records,
tombstones and a fake peer record, accusations, pushed joins/lists/parts (weight 1e30), stalled,
zero-byte, trickling and future-round streams, state downloads and a forged state at round 10^12.
Each colluder (``swarmtrain.simulation.colluder``) is admitted and announces a forged state one
round ahead, vouched for and certified by the colluders as a group of their own; and rank 0, an
admitted member of every round, claims weight 1e30 for its update (the in-group weight attack).
Every run of the command restarts one honest peer mid-run, so a state is downloaded while the
attacks go on.

* The issue's "Done when" command (``--peers 4 --intruders 2 --colluders 2``), with a ``nice``d
  busy process beside it: every kind of attack is tried, none has any effect, the honest peers end
  identical, within 1 % of the clean run's loss; its own control (the same attacks, states taken
  without commit certificates and weights reduced without the cap) shows effects: the test can fail.
* ``open``, the control of admission: the same intruder is let in (its pushed messages are
  acknowledged), so the zero effects above come from admission, not from an attack that does nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from swarmtrain.app.local_run import SIMULATE_DEFAULTS
from swarmtrain.core.config import load_config
from swarmtrain.simulation.outsider import KINDS
from swarmtrain.simulation.runner import run_simulation

DONE_WHEN = ["--peers", "4", "--intruders", "2", "--colluders", "2"]


@pytest.mark.slow
def test_intruders_and_colluders_change_nothing_and_their_control_shows_they_can(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "swarmtrain", "simulate", *DONE_WHEN, "--json", str(out)]
    # a full-load process beside it, as on a busy volunteer's machine (the effect count must hold)
    load = subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", "while True: pass"])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    finally:
        load.kill()
        load.wait()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    print("effects:", data["intruder_effects"], "control:", data["control_effects"])
    assert data["intruders"] == 2 and data["colluders"] == 2 and data["admission"] == "token"
    assert data["intruder_errors"] == [] and data["control_errors"] == []
    for kind in KINDS:
        assert data["intruder_attempts"][kind] > 0, kind
    assert data["colluder_announcements"] > 0
    assert all(v == 0 for v in data["intruder_effects"].values()), data["intruder_effects"]
    assert data["honest_identical"] and data["params_identical"]
    assert abs(data["final_val_loss"] / data["clean_val_loss"] - 1) <= 0.01
    assert 0 < data["honest_rss_growth_mib"] < 200
    # the control: the same attacks with states taken without commit certificates plant a state
    assert data["control_shows_effect"], data["control_effects"]
    assert data["control_effects"]["forged_states_accepted"] > 0, data["control_effects"]
    # rank 0, an admitted member, claims weight 1e30 in every round: capped by the honest owners,
    # reduced as claimed in the control
    assert data["weight_attackers"] == 1
    assert data["control_effects"]["weights_over_cap"] > 0, data["control_effects"]
    assert data["control_honest_downloads"] > 0
    assert "effects: none" in proc.stdout
    assert "control (" in proc.stdout and "the control showed no effect" not in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # piped, it still shows progress: plain timestamped lines (issue 17)
    line = r"^\d\d:\d\d:\d\d diloco\+int8.*: step \d+/120 round \d+ \(\d+ trainers?\) loss \d"
    assert re.search(line, proc.stderr, re.M), proc.stderr


@pytest.mark.slow
def test_without_admission_the_same_intruder_gets_in() -> None:
    cfg = load_config(
        None,
        {
            "train.steps": 20,
            "strategy.inner_steps": 10,
            "peers.min_peers": 2,
            "peers.admission": "open",
            "peers.round_timeout": 10.0,  # the rounds it breaks fail sooner
        },
        base=SIMULATE_DEFAULTS,
        env={},
    )
    res = run_simulation(cfg, 3, timeout=900, intruders=1)
    assert res.intruder_errors == []
    accepted = res.intruder_reports[0]["accepted"]
    # joins, lists and parts from a peer nobody admitted are acknowledged (what admission refuses);
    # how much of the flood lands depends on the rounds' timing, so it is not asserted
    assert accepted["pushed_messages"] > 0, accepted
