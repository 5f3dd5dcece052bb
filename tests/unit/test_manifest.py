"""The signed run manifest: what a volunteer accepts from a peer, and how its config is built from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peers.trust.admission import RunKey
from peers.trust.manifest import (
    MAX_MANIFEST_BYTES,
    RunManifest,
    compatible_versions,
    open_policy_problem,
    parse_manifest,
    sign_manifest,
)
from swarmtrain.app.peer.run_manifest import check_open_policy, config_from_manifest, make_manifest
from swarmtrain.core import __version__
from swarmtrain.core.config import load_config
from swarmtrain.core.errors import ConfigError, ProtocolError


@pytest.fixture
def key(tmp_path: Path) -> RunKey:
    return RunKey.generate(tmp_path / "run.key")


def _cfg(**options: object):  # type: ignore[no-untyped-def]
    base = {"peers.run_id": "t-man", "peers.admission": "token", "strategy.name": "diloco"}
    return load_config(None, {**base, "compression.codec": "int8", **options}, env={})


def test_a_manifest_round_trips_and_carries_the_run_wide_settings(key: RunKey) -> None:
    doc = make_manifest(_cfg(**{"strategy.inner_steps": 7}), key)
    m = parse_manifest(doc)
    assert (m.run_id, m.admission, m.run_public_key, m.software) == (
        "t-man",
        "token",
        key.public_hex,
        __version__,
    )
    assert m.settings["strategy"]["inner_steps"] == 7 and m.settings["compression"]["codec"] == "int8"
    assert set(m.settings["train"]) >= {"seed", "lr"} and "device" not in m.settings["train"]
    assert m.initial_state_hash is not None and len(m.initial_state_hash) == 64


def test_any_change_to_a_signed_manifest_is_refused(key: RunKey) -> None:
    doc = json.loads(make_manifest(_cfg(), key))
    doc["manifest"]["settings"]["compression"]["codec"] = "ternary"
    with pytest.raises(ProtocolError, match="signature"):
        parse_manifest(json.dumps(doc).encode())


def test_a_manifest_signed_by_another_key_than_it_names_is_refused(key: RunKey, tmp_path: Path) -> None:
    thief = RunKey.generate(tmp_path / "thief.key")
    doc = json.loads(make_manifest(_cfg(), thief))
    doc["manifest"]["run_public_key"] = key.public_hex  # claims the real run's key
    with pytest.raises(ProtocolError, match="signature"):
        parse_manifest(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 5000 + b"]" * 5000,  # RecursionError in json.loads without the depth scan
        b'{"manifest": ' * 20 + b"1" + b"}" * 20,
        b"x" * (MAX_MANIFEST_BYTES + 1),
        b'{"manifest": {"format": 1}, "signature": "' + b"0" * 128 + b'"}',
        b'{"manifest": {"format": NaN}, "signature": ""}',
        b"\xff\xfe",
        b"[]",
    ],
)
def test_malformed_manifests_are_protocol_errors(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_manifest(data)


def test_an_open_run_needs_a_robust_reducer_at_creation_and_on_read(key: RunKey) -> None:
    assert open_policy_problem("open", "mean", 0) is not None
    assert open_policy_problem("open", "centered_clip", 0) is not None
    assert open_policy_problem("open", "centered_clip", 1) is None
    assert open_policy_problem("token", "mean", 0) is None
    with pytest.raises(ConfigError, match="refused"):
        make_manifest(_cfg(**{"peers.admission": "open"}), key)
    # a manifest signed with open + mean by hand (not through make_manifest) is refused on read
    settings = {"peers": {"run_id": "t-man", "admission": "open", "reducer": "mean", "byzantine_f": 0}}
    m = RunManifest("t-man", key.public_hex, "open", __version__, settings)
    with pytest.raises(ConfigError, match="refused by its peers"):
        sign_manifest(key, m)
    ok = make_manifest(
        _cfg(**{"peers.admission": "open", "peers.reducer": "centered_clip", "peers.byzantine_f": 1}), key
    )
    assert parse_manifest(ok).admission == "open"


def test_join_refuses_open_with_the_mean_unless_told_the_network_is_trusted() -> None:
    with pytest.raises(ConfigError, match="open_unprotected"):
        check_open_policy(_cfg(**{"peers.admission": "open"}))
    check_open_policy(_cfg(**{"peers.admission": "open", "peers.open_unprotected": True}))
    check_open_policy(_cfg())  # token: members are vouched for by the run key


def test_a_volunteer_takes_the_manifest_settings_and_keeps_its_own(key: RunKey) -> None:
    m = parse_manifest(make_manifest(_cfg(**{"strategy.inner_steps": 7, "train.lr": 5e-4}), key))
    cfg = config_from_manifest(
        m, None, {"train.device": "cpu", "train.steps": 9, "train.batch_size": 4}, env={}
    )
    assert (cfg.strategy.name, cfg.strategy.inner_steps, cfg.compression.codec) == ("diloco", 7, "int8")
    assert (cfg.train.lr, cfg.peers.run_public_key, cfg.peers.admission) == (5e-4, key.public_hex, "token")
    assert (cfg.train.device, cfg.train.steps, cfg.train.batch_size) == ("cpu", 9, 4)  # the peer's own


@pytest.mark.parametrize(
    ("override", "key_name"),
    [
        ({"compression.codec": "ternary"}, "compression.codec"),
        ({"strategy.name": "demo"}, "strategy."),
        ({"strategy.inner_steps": 8}, "strategy.inner_steps"),
        ({"peers.reducer": "coordinate_median"}, "peers.reducer"),
        ({"train.lr": 0.5}, "train.lr"),
        ({"model.preset": "small"}, "model.preset"),
    ],
)
def test_a_run_wide_setting_that_differs_from_the_manifest_is_one_line(
    key: RunKey, override: dict[str, object], key_name: str
) -> None:
    m = parse_manifest(make_manifest(_cfg(**{"strategy.inner_steps": 7}), key))
    with pytest.raises(ConfigError) as e:
        config_from_manifest(m, None, override, env={})
    msg = str(e.value)
    assert "\n" not in msg and f"sets {key_name}" in msg and "manifest" in msg


def test_another_release_or_another_initial_model_is_refused(key: RunKey) -> None:
    m = parse_manifest(make_manifest(_cfg(), key))
    old = RunManifest(m.run_id, m.run_public_key, m.admission, "0.0.1", m.settings, created=m.created)
    with pytest.raises(ConfigError, match=r"runs swarmtrain 0\.0\.1; this is .*install a 0\.0\.x release"):
        config_from_manifest(parse_manifest(sign_manifest(key, old)), None, {}, env={})
    other = RunManifest(
        m.run_id, m.run_public_key, m.admission, m.software, m.settings, initial_state_hash="0" * 64
    )
    with pytest.raises(ConfigError, match="another initial model"):
        config_from_manifest(parse_manifest(sign_manifest(key, other)), None, {}, env={})
    assert compatible_versions("1.4.0", "1.4.9") and not compatible_versions("1.4.0", "1.5.0")


def test_the_manifest_fuzz_raises_nothing_but_protocol_errors(key: RunKey) -> None:
    import random

    doc = make_manifest(_cfg(), key)
    rng = random.Random(13)
    for _ in range(3000):
        data = bytearray(doc)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            op = rng.random()
            if op < 0.5:
                data[i] = rng.randrange(256)
            elif op < 0.75:
                del data[i : i + rng.randint(1, 20)]
            else:
                data[i:i] = rng.choice([b"[", b"{", b'"', b"1e999", b"-", b"null", b"\\u0000"])
        try:
            parse_manifest(bytes(data))
        except ProtocolError:
            pass
