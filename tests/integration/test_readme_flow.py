"""The README's volunteer flow, as a new volunteer types it (issue 31): ``run init``, ``dht`` with the
manifest, ``identity``, ``token issue``, ``doctor`` with the identity and token, two ``join``s with
their tokens, ``status`` without ``--config``; real processes on 127.0.0.1. The doctor must print the
verdict the README shows; ``status`` sees both volunteers with what they contributed (issue 31.6:
tokens of their own steps in the rounds they committed, and those rounds), and each ``join`` ends
saying the same."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from peer_helpers import SWARMTRAIN
from test_manifest_join import _init, _volunteer
from test_node import _start_dht

from swarmtrain.app.units import short_count

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_verdict() -> str:
    """The verdict line of the README's doctor sample."""
    found = re.search(r"^verdict: (.+)$", README.read_text(), re.MULTILINE)
    assert found, "the README shows no doctor verdict"
    return found.group(1).strip()


#: steps per volunteer: 3 rounds at the manifest's H = 5 (``_init``), so that ``status`` finds both
#: alive after their first commit while keeping the test short
STEPS = 15


def _status(maddr: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """``swarmtrain status --json`` with nothing but the bootstrap's address (no --config)."""
    got = subprocess.run(
        [*SWARMTRAIN, "status", "--initial-peers", maddr, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert got.returncode == 0, got.stderr[-2000:]
    rows: list[dict[str, Any]] = json.loads(got.stdout)
    return rows


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_readme_volunteer_flow_doctor_joins_and_status_follow_the_manifest(tmp_path: Path) -> None:
    run_dir, boot_token = _init(tmp_path, "myrun", "t-manifest")
    boot, _, maddrs = _start_dht(
        run_dir / "bootstrap.key", "--manifest", str(run_dir / "run.manifest"), "--token", boot_token
    )
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(tmp_path / "xdg"),
        "SWARMTRAIN_TRAIN__THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    joins: dict[str, subprocess.Popen[str]] = {}
    try:
        key, token = _volunteer(tmp_path, run_dir, "vol")
        key_b, token_b = _volunteer(tmp_path, run_dir, "vol-b")
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
        per_step = re.search(r"(\d+) tokens/step", doc.stdout)  # the run's model, this machine's batch
        assert per_step, doc.stdout
        tokens_per_step = int(per_step.group(1))

        # the README's join line, as two volunteers type it (plus this test's short run)
        short = {**env, "SWARMTRAIN_TRAIN__EVAL_INTERVAL": "100000", "SWARMTRAIN_TRAIN__EVAL_BATCHES": "4"}
        for name, k, tok in (("a", key, token), ("b", key_b, token_b)):
            argv = [*SWARMTRAIN, "join", "--initial-peers", maddrs[0], "--identity", str(k), "--token", tok]
            argv += ["--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--steps", str(STEPS)]
            argv += ["--json", str(tmp_path / f"{name}.json")]
            err = (tmp_path / f"{name}.err").open("w")
            joins[name] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=short)

        # status without --config, while they train: both volunteers, each with what it contributed
        trainers: list[dict[str, Any]] = []
        while len([r for r in trainers if r["committed_rounds"] >= 1]) < 2:
            logs = [(tmp_path / f"{n}.err").read_text()[-1500:] for n in joins]
            assert all(p.poll() is None for p in joins.values()), ("a join ended first", trainers, logs)
            rows = _status(maddrs[0], env)
            assert {r["run_id"] for r in rows} == {"t-manifest"}, rows
            trainers = [r for r in rows if r["role"] == "trainer"]
        assert len(trainers) == 2 and ["bootstrap"] == [r["role"] for r in rows if r["role"] != "trainer"]
        seen = {r["peer_id"]: r for r in trainers}
        for r in trainers:
            assert 0 < r["contributed_tokens"] <= r["step"] * tokens_per_step, r
            assert r["contributed_tokens"] % tokens_per_step == 0, r
            assert r["committed_rounds"] == r["extra"]["committed"], r

        for name, p in joins.items():
            out, _ = p.communicate(timeout=300)
            assert p.returncode == 0, (out, (tmp_path / f"{name}.err").read_text()[-2000:])
            res = json.loads((tmp_path / f"{name}.json").read_text())
            # its final figures: at least what status showed, and the end line says them
            before = seen[res["peer_id"]]
            assert res["committed_rounds"] >= before["committed_rounds"] >= 1, (res, before)
            assert res["contributed_tokens"] >= before["contributed_tokens"], (res, before)
            assert 0 < res["contributed_tokens"] <= res["steps"] * tokens_per_step, res
            end = f"done: {res['steps']} steps, {res['committed_rounds']} rounds committed, "
            end += f"{short_count(res['contributed_tokens'])} tokens contributed"
            assert end in out.splitlines(), out
    finally:
        for p in joins.values():
            if p.poll() is None:
                p.kill()
        boot.terminate(grace=5.0)
