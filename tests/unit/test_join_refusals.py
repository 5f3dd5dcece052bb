"""``join``'s config loading against the manifest its initial peer serves (issues 30.2 and 31.4): the
token is checked against the manifest's key whatever policy it states, a model beyond this machine is
refused before anything is built, and each bad token gets its own line."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest

from peers.dht import manifest_fetch
from peers.keys.identity import ensure_identity
from peers.trust.admission import RunKey, encode_token_text
from peers.trust.manifest import RunManifest, parse_manifest, run_wide_settings, sign_manifest
from swarmtrain.app.commands.join import load_join_config
from swarmtrain.app.peer.run_manifest import make_manifest
from swarmtrain.app.peer.token_check import check_token_signer
from swarmtrain.core import __version__
from swarmtrain.core.config import load_config
from swarmtrain.core.errors import ConfigError

RUN = "t-refuse"
_OPEN = {"peers.admission": "open", "peers.reducer": "coordinate_median", "peers.byzantine_f": 1}


def _manifest(key: RunKey, **options: object) -> bytes:
    base = {"peers.run_id": RUN, "strategy.name": "diloco", "compression.codec": "int8"}
    cfg = load_config(None, {**base, **options}, env={})
    if cfg.model.n_layer is None:
        return make_manifest(cfg, key)
    # a huge model: signed as make_manifest does, with a made-up initial hash (building it to hash it
    # is what must not happen)
    settings = run_wide_settings(cfg.model_dump(mode="json"))
    settings["peers"]["run_public_key"] = key.public_hex
    m = RunManifest(
        RUN, key.public_hex, cfg.peers.admission, __version__, settings, initial_state_hash="0" * 64
    )
    return sign_manifest(key, m)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[RunKey, RunKey]:
    return RunKey.generate(tmp_path / "run.key"), RunKey.generate(tmp_path / "impostor.key")


def _token(key: RunKey, peer_id: str, run_id: str = RUN) -> str:
    return encode_token_text(key.issue(run_id, peer_id, time.time() + 3600))


def _served(monkeypatch: pytest.MonkeyPatch, document: bytes) -> None:
    """The initial peer serves ``document`` (the network fetch is ``test_manifest_join``'s)."""
    monkeypatch.setattr(
        manifest_fetch, "fetch_manifest", lambda *_a, **_k: (parse_manifest(document), document, "Qm")
    )


def _never_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the model fails the test (a regression must not allocate a TiB on the test machine)."""
    import swarmtrain.app.models as models

    def built(*_a: object, **_k: object) -> None:
        raise AssertionError("the model was built")

    monkeypatch.setattr(models, "build_model", built)


def _load(tmp_path: Path, token: str, **more: Any) -> Any:
    overrides = {
        "peers.initial_peers": ["/ip4/127.0.0.1/tcp/1/p2p/QmX"],
        "peers.identity_path": str(tmp_path / "vol.key"),
        "peers.token": token,
        "train.device": "cpu",
        **more,
    }
    return load_join_config(None, overrides, by_manifest=True)


def test_an_impostor_manifest_saying_open_does_not_skip_the_token_check(
    keys: tuple[RunKey, RunKey], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_key, impostor = keys
    token = _token(run_key, ensure_identity(tmp_path / "vol.key"))
    # the impostor names a model no machine holds: the token check comes first, and nothing is built
    doc = _manifest(
        impostor,
        **_OPEN,
        **{"model.n_layer": 96, "model.n_embd": 16384, "model.n_head": 128},
    )
    _served(monkeypatch, doc)
    _never_built(monkeypatch)
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, token)
    assert "did not issue your token" in str(e.value) and "check the address" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_model_beyond_this_machine_is_refused_before_it_is_built(
    keys: tuple[RunKey, RunKey], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trust on first contact (no token): the manifest names 96 layers x 16384 wide (311 G
    parameters, over a TiB); join refuses it in one line instead of printing the budget and
    building it."""
    run_key, _ = keys
    doc = _manifest(
        run_key,
        **_OPEN,
        **{"model.n_layer": 96, "model.n_embd": 16384, "model.n_head": 128},
    )
    _served(monkeypatch, doc)
    _never_built(monkeypatch)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, "")
    msg = str(e.value)
    assert "\n" not in msg and "96 layers x 16384 wide" in msg and "cannot take part" in msg, msg
    assert time.perf_counter() - t0 < 30


def test_the_real_run_with_its_own_token_loads(
    keys: tuple[RunKey, RunKey], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_key, _ = keys
    token = _token(run_key, ensure_identity(tmp_path / "vol.key"))
    _served(monkeypatch, _manifest(run_key, **{"peers.admission": "token", "strategy.inner_steps": 7}))
    cfg = _load(tmp_path, token)
    assert (cfg.peers.run_id, cfg.strategy.inner_steps) == (RUN, 7)


def test_each_bad_token_names_its_own_cause(keys: tuple[RunKey, RunKey], tmp_path: Path) -> None:
    run_key, impostor = keys
    peer = ensure_identity(tmp_path / "vol.key")
    good = _token(run_key, peer)
    check_token_signer(good, RUN, run_key.public_hex)  # no error
    messages = []
    for text in ("garbage123", good[: len(good) // 2], "not base64 !!"):
        with pytest.raises(ConfigError) as e:
            check_token_signer(text, RUN, run_key.public_hex)
        messages.append(str(e.value))
        assert "is not a join token" in str(e.value) and "did not issue" not in str(e.value), e.value
    i = len(good) - 10  # inside the signature
    changed = good[:i] + ("A" if good[i] != "A" else "B") + good[i + 1 :]
    with pytest.raises(ConfigError) as e:
        check_token_signer(changed, RUN, run_key.public_hex)
    assert f"bad signature: its character {i + 1}" in str(e.value) and "copy the token again" in str(e.value)
    j = 20  # inside the body (the run ID / peer ID)
    changed = good[:j] + ("A" if good[j] != "A" else "B") + good[j + 1 :]
    with pytest.raises(ConfigError, match=f"bad signature: its character {j + 1}"):
        check_token_signer(changed, RUN, run_key.public_hex)
    with pytest.raises(ConfigError) as e:  # a valid token, but the manifest is the impostor's
        check_token_signer(good, RUN, impostor.public_hex)
    assert "did not issue your token" in str(e.value) and "bad signature" not in str(e.value)
    with pytest.raises(ConfigError, match="your token is for run 'other'"):
        check_token_signer(_token(run_key, peer, "other"), RUN, impostor.public_hex)


def test_an_address_with_nothing_listening_or_a_dropped_connect_is_named() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert "nothing listens at 127.0.0.1:" in (
        manifest_fetch.reach_tcp(f"/ip4/127.0.0.1/tcp/{port}/p2p/Qm") or ""
    )
    with socket.socket() as full:  # a listener that never accepts, its backlog full: SYNs are dropped
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        addr = full.getsockname()
        held = [socket.socket() for _ in range(3)]
        for h in held:
            h.setblocking(False)
            h.connect_ex(addr)
        try:
            got = manifest_fetch.reach_tcp(f"/ip4/127.0.0.1/tcp/{addr[1]}/p2p/Qm", timeout=1.0)
        finally:
            for h in held:
                h.close()
    assert got is not None and "did not answer within 1 s" in got and "firewall or NAT" in got, got
    assert (
        manifest_fetch.dial_problem(
            RuntimeError("Daemon failed to start: 2026/12/04 14:25:03 failed to connect to bootstrap peers")
        )
        == "Daemon failed to start: failed to connect to bootstrap peers"
    )


def _result(committed: int, by_signal: bool = False) -> Any:
    from swarmtrain.app.peer.volunteer import VolunteerResult

    return VolunteerResult(
        peer_id="Qm",
        steps=49,
        final_train_loss=3.0,
        final_val_loss=None,
        final_digest="d",
        committed_rounds=committed,
        stopped_by_signal=by_signal,
    )


def test_join_json_is_written_on_every_exit_and_zero_rounds_is_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from swarmtrain.app.commands import join
    from swarmtrain.core.errors import SwarmError

    out = tmp_path / "j.json"
    monkeypatch.setattr(join, "_volunteer", lambda *_a, **_k: _result(0))
    with pytest.raises(SwarmError, match="no round committed in 49 steps"):
        join.run_join(None, {}, out)
    got = json.loads(out.read_text())
    assert got["exit_code"] == 1 and "no round committed" in got["reason"] and got["steps"] == 49
    monkeypatch.setattr(join, "_volunteer", lambda *_a, **_k: _result(0, by_signal=True))
    join.run_join(None, {}, out)  # the volunteer chose to leave: exit 0
    assert json.loads(out.read_text())["reason"] == "stopped by signal"
    monkeypatch.setattr(join, "_volunteer", lambda *_a, **_k: _result(3))
    join.run_join(None, {}, out)
    assert (json.loads(out.read_text())["exit_code"], json.loads(out.read_text())["reason"]) == (0, "done")

    def refused(*_a: object, **_k: object) -> None:
        raise ConfigError("run 'x' sets compression.codec = 'int8'")

    monkeypatch.setattr(join, "_volunteer", refused)
    with pytest.raises(ConfigError):
        join.run_join(None, {}, out)
    assert json.loads(out.read_text()) == {
        "exit_code": 2,
        "reason": "run 'x' sets compression.codec = 'int8'",
    }

    def gave_up(*_a: object, **_k: object) -> None:
        raise SwarmError("no round committed for 300 s")

    monkeypatch.setattr(join, "_volunteer", gave_up)
    with pytest.raises(SwarmError):
        join.run_join(None, {}, out)
    assert json.loads(out.read_text()) == {"exit_code": 1, "reason": "no round committed for 300 s"}


def test_a_doctor_probe_failure_says_why() -> None:
    from swarmtrain.app.doctor.network import probe_failure
    from swarmtrain.core.errors import PeerTimeoutError, ProtocolError, SwarmError

    closed = ProtocolError("stream closed in the middle of a frame")
    assert probe_failure(closed, "token", False, 30).startswith("not admitted: run admits by token; pass")
    assert probe_failure(closed, "token", True, 30).startswith("refused the probe")
    assert probe_failure(PeerTimeoutError("took over 30 s"), "open", False, 30).startswith("timed out")
    assert probe_failure(SwarmError("no route"), "open", False, 30) == "unreachable: no route"
