"""``[swarm]`` (``swarmtrain.core.swarm_config``) and ``join --role server|trainer``'s checks: a bad
section, role or stage is one line and exit 2, before any node starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from swarmtrain.app.cli import run
from swarmtrain.app.swarm.join import check_role_flags, parse_stage, settings_from_config
from swarmtrain.core.config import load_config
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.swarm_config import SwarmConfig


def test_one_type_for_the_swarm_settings_with_its_own_checks() -> None:
    """``SwarmConfig`` is the settings every SWARM role, the simulation and the benchmarks take: its
    defaults, and a bad value refused where it is built in code too (``ValidationError`` naming it)."""
    from pydantic import ValidationError

    assert SwarmConfig().model_dump() == {
        "stages": 2,
        "codec": "none",
        "sync_codec": "none",
        "sync_period": 5.0,
        "max_queue": 8,
        "microbatches": 100,
        "trainers": 1,
        "accumulate": 1,
        "device_s": 0.0,
        "rebalance": True,
        "hysteresis": 0.2,
        "patience": 10.0,
        "cooldown": 60.0,
        "verify_rate": 0.1,
    }
    for bad in ({"stages": 1}, {"device_s": 60.0}, {"sync_period": 0.0}, {"patience": -1.0}):
        with pytest.raises(ValidationError, match=next(iter(bad))):
            SwarmConfig(**bad)
    settings = SwarmConfig(stages=3, trainers=2)
    with pytest.raises(ValidationError, match="trainers"):
        settings.trainers = 0  # assignments are checked too
    assert SwarmConfig(**settings.model_dump()) == settings  # what a child process rebuilds


def test_the_section_loads_from_toml_and_the_environment(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('[swarm]\nstages = 3\ncodec = "int8"\ntrainers = 2\nmicrobatches = 7\naccumulate = 2\n')
    cfg = load_config(toml, env={"SWARMTRAIN_SWARM__MAX_QUEUE": "3"})
    assert (cfg.swarm.stages, cfg.swarm.codec, cfg.swarm.max_queue) == (3, "int8", 3)
    settings = settings_from_config(cfg)
    assert settings == SwarmConfig(
        stages=3, codec="int8", trainers=2, microbatches=7, accumulate=2, max_queue=3
    )
    assert load_config(None, env={}).swarm == SwarmConfig()  # a config without [swarm]: the defaults


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("swarm.stages", 1, "swarm.stages"),
        ("swarm.trainers", 0, "swarm.trainers"),
        ("swarm.microbatches", 0, "swarm.microbatches"),
        ("swarm.max_queue", 0, "swarm.max_queue"),
        ("swarm.accumulate", 0, "swarm.accumulate"),
        ("swarm.sync_period", 0.0, "swarm.sync_period"),
        ("swarm.device_s", 60.0, "swarm.device_s"),
        ("swarm.hysteresis", -0.1, "swarm.hysteresis"),
        ("swarm.cooldown", -1.0, "swarm.cooldown"),
        ("swarm.bogus", 1, "swarm.bogus"),
    ],
)
def test_bad_values_are_one_line_naming_the_field(key: str, value: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(None, {key: value}, env={})


def test_settings_are_checked_against_the_model_and_the_codecs() -> None:
    with pytest.raises(ConfigError, match="exceeds the model's 4 blocks"):
        settings_from_config(load_config(None, {"swarm.stages": 5}, env={}))
    with pytest.raises(ConfigError, match="^swarm.sync_codec: .*nope"):
        settings_from_config(load_config(None, {"swarm.sync_codec": "nope"}, env={}))


def test_stage_flag() -> None:
    assert parse_stage(None, 2) is None and parse_stage("auto", 2) is None and parse_stage("AUTO", 3) is None
    assert parse_stage("1", 2) == 1
    with pytest.raises(ConfigError, match=r"--stage 2 is outside \[0, 2\)"):
        parse_stage("2", 2)
    with pytest.raises(ConfigError, match="expected auto or a stage number"):
        parse_stage("first", 2)
    check_role_flags("server", "auto", None)
    check_role_flags("trainer", None, 1)
    check_role_flags("peer", None, None)


@pytest.fixture
def run_toml(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text("[peers]\nopen_unprotected = true\n\n[swarm]\nstages = 2\ntrainers = 1\n")
    return path


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--role", "x"], "--role 'x': choose one of peer, server, trainer"),
        (["--stage", "1"], "--stage applies to --role server only (this peer's role: peer)"),
        (["--role", "trainer", "--stage", "0"], "--stage applies to --role server only"),
        (["--role", "server", "--trainer-index", "0"], "--trainer-index applies to --role trainer only"),
        (["--role", "server", "--stage", "7", "-c", "{toml}"], "--stage 7 is outside [0, 2)"),
        (["--role", "server", "--stage", "one", "-c", "{toml}"], "expected auto or a stage number"),
        (["--role", "server", "-H", "5", "-c", "{toml}"], "--inner-steps does not apply to --role server"),
        (["--role", "trainer", "--strategy", "diloco", "-c", "{toml}"], "--strategy does not apply"),
        (
            ["--role", "server", "--compressor", "int8", "-c", "{toml}"],
            "--compressor does not apply to --role server: a SWARM run's settings are its config's "
            "[swarm] section (the codec between stages is --activation-codec)",
        ),
        (["--activation-codec", "int8"], "--activation-codec applies to --role server or trainer only"),
        (["--role", "server", "--activation-codec", "nope", "-c", "{toml}"], "swarm.codec: "),
        (
            ["--role", "trainer", "--trainer-index", "1", "-c", "{toml}"],
            "--trainer-index 1 is outside [0, 1)",
        ),
    ],
)
def test_bad_role_flags_are_one_line(
    argv: list[str], needle: str, run_toml: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.replace("{toml}", str(run_toml)) for a in argv]
    assert run(["join", "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/QmNone", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("swarmtrain: error:") and needle in err, err


def test_a_bad_swarm_section_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('[peers]\nopen_unprotected = true\n\n[swarm]\ncodec = "nope"\n')
    assert run(["join", "--role", "server", "-c", str(toml)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "swarm.codec" in err, err


def test_the_activation_codec_flag_sets_the_swarm_section(
    monkeypatch: pytest.MonkeyPatch, run_toml: Path
) -> None:
    from swarmtrain.app.swarm import join as swarm_join

    seen: dict[str, object] = {}

    def take_role(role: str, stage: object, index: object, load: Any, overrides: Any, json: object) -> None:
        seen["codec"] = load().swarm.codec

    monkeypatch.setattr(swarm_join, "run_swarm_join", take_role)
    argv = ["join", "--role", "trainer", "--activation-codec", "int8", "-c", str(run_toml)]
    assert run(argv) == 0
    assert seen == {"codec": "int8"}
