"""The README's volunteer flow, as a new volunteer types it (issue 31): ``run init``, ``dht`` with the
manifest, ``identity``, ``token issue``, ``doctor`` with the identity and token, ``status`` without
``--config``; real processes on 127.0.0.1. The doctor must print the verdict the README shows."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from peer_helpers import SWARMTRAIN
from test_manifest_join import _init, _volunteer
from test_node import _start_dht

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_verdict() -> str:
    """The verdict line of the README's doctor sample."""
    found = re.search(r"^verdict: (.+)$", README.read_text(), re.MULTILINE)
    assert found, "the README shows no doctor verdict"
    return found.group(1).strip()


@pytest.mark.timeout(400)
def test_the_readme_volunteer_flow_doctor_and_status_follow_the_manifest(tmp_path: Path) -> None:
    run_dir, boot_token = _init(tmp_path, "myrun", "t-manifest")
    boot, _, maddrs = _start_dht(
        run_dir / "bootstrap.key", "--manifest", str(run_dir / "run.manifest"), "--token", boot_token
    )
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg"), "SWARMTRAIN_TRAIN__THREADS": "1"}
    try:
        key, token = _volunteer(tmp_path, run_dir, "vol")
        doc = subprocess.run(
            [*SWARMTRAIN, "doctor", "--initial-peers", maddrs[0], "--identity", str(key), "--token", token],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
        )
        assert doc.returncode == 0, doc.stdout + doc.stderr[-2000:]
        verdict = re.search(r"^verdict: (.+)$", doc.stdout, re.MULTILINE)
        readme = _readme_verdict()  # "trainer (CPU)"; on a loaded machine a step may take over 1 s
        assert verdict and verdict.group(1).strip() in (readme, readme.replace(")", ", slow)")), doc.stdout
        assert re.search(r"^peer \w+ +ok .* bootstrap: 5 pings", doc.stdout, re.MULTILINE), doc.stdout
        assert "joined; 1 live peer(s) of run 't-manifest'" in " ".join(doc.stdout.split()), doc.stdout
        status = subprocess.run(
            [*SWARMTRAIN, "status", "--initial-peers", maddrs[0], "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert status.returncode == 0, status.stderr[-2000:]
        rows = json.loads(status.stdout)
        assert [r["role"] for r in rows] == ["bootstrap"] and rows[0]["run_id"] == "t-manifest", rows
    finally:
        boot.terminate(grace=5.0)
