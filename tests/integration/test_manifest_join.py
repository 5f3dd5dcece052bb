"""A run made by ``swarmtrain run init``: its bootstrap serves the signed manifest, and volunteers
join with nothing but its address, an identity and a token (real processes on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from peer_helpers import LOOP
from test_join import _env
from test_node import CLI, _cli, _start_dht

from peers.dht.process import find_orphans


def _init(tmp: Path, name: str, run_id: str) -> tuple[Path, str]:
    """``run init`` (DiLoCo H=5, int8): the run folder and the bootstrap token it printed."""
    run_dir = tmp / name
    init = _cli("run", "init", str(run_dir), "--run-id", run_id, "-H", "5")
    assert init.returncode == 0, init.stderr
    boot_cmd = next(x for x in init.stdout.splitlines() if "swarmtrain dht" in x).split()
    assert "--manifest" in boot_cmd
    return run_dir, boot_cmd[boot_cmd.index("--token") + 1]


def _volunteer(tmp: Path, run_dir: Path, name: str) -> tuple[Path | None, str]:
    """A volunteer's identity file and token; ``"a"`` uses this machine's default identity (no
    --identity anywhere: ``swarmtrain identity`` and ``join`` find it under ``XDG_DATA_HOME``)."""
    key = None if name == "a" else tmp / f"{name}.key"
    env = {**os.environ, "XDG_DATA_HOME": str(tmp / "xdg")}
    args = [] if key is None else [str(key)]
    got = subprocess.run([*CLI, "identity", *args], capture_output=True, text=True, timeout=120, env=env)
    peer_id = got.stdout.strip()
    assert got.returncode == 0 and peer_id, got.stderr
    issued = _cli("token", "issue", "--run-key", str(run_dir / "run.key"), "--run-id", "t-manifest", peer_id)
    assert issued.returncode == 0, issued.stderr
    return key, issued.stdout.strip()


def _join(
    home: Path, maddr: str, key: Path | None, token: str, *extra: str, **popen: object
) -> subprocess.Popen[str]:
    ident = [] if key is None else ["--identity", str(key)]
    argv = [*CLI, "join", "--initial-peers", maddr, *ident, "--token", token, *LOOP, *extra]
    env = {**_env(), "XDG_DATA_HOME": str(home / "xdg")}
    return subprocess.Popen(argv, env=env, text=True, **popen)  # type: ignore[call-overload,no-any-return]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_volunteers_join_by_the_manifest_alone_and_a_mismatch_or_an_impostor_is_one_line(
    tmp_path: Path,
) -> None:
    """Two volunteers given only the bootstrap's address and a token (one also an identity file,
    one this machine's default identity) take the run's settings from its signed manifest and
    commit rounds together; one that sets another codec is refused in one line before any work;
    one pointed at an impostor's bootstrap (same run ID, its own key and manifest) is refused in one
    line, because the real run's token does not verify under the impostor's key."""
    run_dir, boot_token = _init(tmp_path, "run", "t-manifest")
    fake_dir, fake_token = _init(tmp_path, "fake", "t-manifest")
    boot, _, maddrs = _start_dht(
        run_dir / "bootstrap.key", "--manifest", str(run_dir / "run.manifest"), "--token", boot_token
    )
    fake, _, fake_maddrs = _start_dht(
        fake_dir / "bootstrap.key", "--manifest", str(fake_dir / "run.manifest"), "--token", fake_token
    )
    procs: list[subprocess.Popen[str]] = []
    try:
        key_a, tok_a = _volunteer(tmp_path, run_dir, "a")
        key_b, tok_b = _volunteer(tmp_path, run_dir, "b")

        mismatch = _join(tmp_path, maddrs[0], key_a, tok_a, "--compressor", "ternary", stderr=subprocess.PIPE)
        _, err = mismatch.communicate(timeout=120)
        assert mismatch.returncode == 2, err[-2000:]
        assert err.strip().splitlines() == [
            "swarmtrain: error: run 't-manifest' sets compression.codec = 'int8' in its manifest; this "
            "peer sets 'ternary': drop that setting (the manifest carries the run's settings)"
        ]

        impostor = _join(tmp_path, fake_maddrs[0], key_a, tok_a, "--steps", "5", stderr=subprocess.PIPE)
        _, err = impostor.communicate(timeout=120)
        assert impostor.returncode == 2, err[-2000:]
        assert len(err.strip().splitlines()) == 1 and "did not issue your token" in err, err[-2000:]

        for name, key, tok in (("a", key_a, tok_a), ("b", key_b, tok_b)):
            out = tmp_path / f"{name}.json"
            log = (tmp_path / f"{name}.err").open("w")
            procs.append(
                _join(tmp_path, maddrs[0], key, tok, "--steps", "20", "--json", str(out), stderr=log)
            )
        for p in procs:
            assert p.wait(timeout=400) == 0, [(tmp_path / f"{n}.err").read_text()[-2000:] for n in "ab"]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        boot.terminate(grace=5.0)
        fake.terminate(grace=5.0)
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "ab")
    shared = set(a["sync_digests"]) & set(b["sync_digests"])
    assert shared, (a["sync_digests"], b["sync_digests"])  # they committed rounds together
    assert all(a["sync_digests"][r] == b["sync_digests"][r] for r in shared)
    # H = 5 came from the manifest (the default strategy is 'local', which join refuses, and DiLoCo's
    # default H is far above 20 steps): 20 steps give up to 4 rounds
    assert 2 <= a["committed_rounds"] <= 4 and 2 <= b["committed_rounds"] <= 4, (a, b)
    assert find_orphans(boot.marker) == [] and find_orphans(fake.marker) == []
    assert os.path.exists(run_dir / "run.manifest")
