"""Every setting declared once: a command's flags are its options' fields (``swarmtrain.app.commands.flags``)
and the run-wide settings are one list (``peers.trust.manifest.RUN_WIDE_SETTINGS``)."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic import BaseModel

from peers.trust.manifest import PUBLISHED, RUN_WIDE, RUN_WIDE_SETTINGS
from swarmtrain.app.cli import app, run
from swarmtrain.app.commands.flags import config_overrides, flag_specs, options_of
from swarmtrain.app.commands.join import JoinOptions
from swarmtrain.app.commands.simulate import SimulateOptions
from swarmtrain.app.peer.run_agreement import SETTING_FLAGS
from swarmtrain.core.config import STRATEGY_CONFIGS, Config


def _is_config_key(key: str) -> bool:
    section, _, name = key.partition(".")
    if section == "strategy":
        return name == "name" or any(name in m.model_fields for m in STRATEGY_CONFIGS.values())
    field = Config.model_fields.get(section)
    model = field.annotation if field is not None else None
    return isinstance(model, type) and issubclass(model, BaseModel) and name in model.model_fields


def _commands(group: typer.Typer, prefix: str = "") -> dict[str, Any]:
    """Every command of the CLI (``"bench strategies"`` for a sub-app's), name -> its callback."""
    out: dict[str, Any] = {}
    for info in group.registered_commands:
        assert info.name and info.callback is not None
        out[prefix + info.name] = info.callback
    for sub in group.registered_groups:
        assert sub.name and sub.typer_instance is not None
        out.update(_commands(sub.typer_instance, f"{prefix}{sub.name} "))
    return out


#: the commands with no flag that sets a config key: their flags stay typer's parameters
_NO_CONFIG_FLAGS = {"identity", "bench codecs"}
#: command -> the options class its flags are the fields of
COMMAND_OPTIONS = {
    name: options_of(cb) for name, cb in _commands(app).items() if name not in _NO_CONFIG_FLAGS
}


def test_every_command_with_config_flags_is_made_from_its_options() -> None:
    assert set(_commands(app)) >= _NO_CONFIG_FLAGS
    assert COMMAND_OPTIONS["simulate"] is SimulateOptions and COMMAND_OPTIONS["join"] is JoinOptions
    missing = [name for name, options in COMMAND_OPTIONS.items() if options is None]
    assert not missing, f"declare their flags with swarmtrain.app.commands.flags: {missing}"
    assert {"train", "dht", "status", "doctor", "dashboard", "run init", "token issue"} <= set(
        COMMAND_OPTIONS
    )


@pytest.mark.parametrize("options", sorted({o for o in COMMAND_OPTIONS.values() if o}, key=str))
def test_every_flag_key_is_a_config_key(options: type) -> None:
    specs = flag_specs(options)
    assert list(specs) == [f.name for f in fields(options)]
    bad = [s.key for s in specs.values() if s.key is not None and not _is_config_key(s.key)]
    assert not bad, bad
    decls = [d for s in specs.values() for d in s.decls]
    assert len(decls) == len(set(decls)), decls  # no flag name twice


@pytest.mark.parametrize("command", sorted(COMMAND_OPTIONS))
def test_the_help_lists_every_flag(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    options = COMMAND_OPTIONS[command]
    assert options is not None
    assert run([*command.split(), "--help"]) == 0
    out = capsys.readouterr().out
    for spec in flag_specs(options).values():
        assert all(d.split("/")[0] in out for d in spec.decls), spec.decls


def test_flags_become_overrides_and_the_rest_stay_the_commands() -> None:
    opts = SimulateOptions(peers=3, compressor="ternary", activation_codec="int8", data=["a.txt"], chaos="x")
    over = opts.overrides()
    assert over["compression.codec"] == "ternary" and over["swarm.codec"] == "int8"
    assert over["data.paths"] == ["a.txt"] and over["peers.min_peers"] == 2
    assert over["strategy.name"] is None  # not given: the lower layers decide
    assert "chaos" not in " ".join(over)  # --chaos is the command's own
    joined = config_overrides(JoinOptions(initial_peers=["/ip4/a,/ip4/b", "/ip4/c"], host_maddrs=[]))
    assert joined["peers.initial_peers"] == ["/ip4/a", "/ip4/b", "/ip4/c"]
    assert joined["peers.host_maddrs"] is None and joined["data.paths"] is None


def test_one_list_of_run_wide_settings() -> None:
    """The manifest's sections and the records' published settings both come from it."""
    assert RUN_WIDE["swarm"] is None and RUN_WIDE["model"] is None
    assert RUN_WIDE["train"] is not None and "seed" in RUN_WIDE["train"]
    assert SETTING_FLAGS == {
        "strategy": "--strategy",
        "inner_steps": "--inner-steps",
        "codec": "--compressor",
        "reducer": "[peers] reducer",
        "byzantine_f": "[peers] byzantine_f",
    }
    for name, setting in PUBLISHED.items():
        section, _, field = setting.key.partition(".")
        assert setting in RUN_WIDE_SETTINGS and _is_config_key(setting.key), name
        assert RUN_WIDE[section] is None or field in (RUN_WIDE[section] or ()), name


def test_simulate_swarm_reads_the_config_swarm_section(tmp_path: Path) -> None:
    """``--stages``, ``--trainers`` and ``--activation-codec`` over the config's ``[swarm]``, which
    gives the rest; each trainer feeds ``--steps`` micro-batches, and no server moves under chaos."""
    from swarmtrain.app.commands.simulate_swarm import swarm_settings

    toml = tmp_path / "run.toml"
    toml.write_text('[swarm]\nstages = 3\ncodec = "ternary"\naccumulate = 2\nsync_period = 7.0\n')
    opts = SimulateOptions(
        peers=4, strategy="swarm", config=toml, activation_codec="int8", steps=9, chaos="kill=1/min"
    )
    cfg, settings = swarm_settings(opts, replace(opts, strategy=None).load_config)
    assert (settings.stages, settings.codec, settings.accumulate, settings.sync_period) == (3, "int8", 2, 7.0)
    assert settings.microbatches == 9 == cfg.train.steps and settings.rebalance is False


def test_the_flags_a_swarm_role_refuses_are_joins() -> None:
    from swarmtrain.app.swarm.join import _PEER_ONLY

    by_key = {s.key: s.decls[0] for s in flag_specs(JoinOptions).values() if s.key is not None}
    assert {key: by_key.get(key) for key in _PEER_ONLY} == _PEER_ONLY


def test_the_other_commands_overrides() -> None:
    """train's flags, run init's admission defaults and the bench grid's shared settings."""
    from swarmtrain.app.commands.bench import StrategiesOptions
    from swarmtrain.app.commands.train import TrainOptions
    from swarmtrain.app.commands.trust import RunInitOptions, _run_options

    over = config_overrides(TrainOptions(steps=5, compile_=False, data=["a.txt"], resume="ck"))
    assert over["train.steps"] == 5 and over["train.compile"] is False and over["data.paths"] == ["a.txt"]
    assert over["train.lr"] is None and "ck" not in over.values()
    opened = _run_options(RunInitOptions(directory=Path("r"), admission="open", strategy="demo"))
    assert opened["peers.reducer"] == "centered_clip" and opened["peers.byzantine_f"] == 1
    assert "strategy.inner_steps" not in opened and opened["peers.run_id"] == "swarmtrain"
    tok = _run_options(RunInitOptions(directory=Path("r"), tolerate=2))
    assert (tok["peers.reducer"], tok["peers.byzantine_f"], tok["strategy.inner_steps"]) == ("mean", 2, 30)
    assert StrategiesOptions(preset="small").base_overrides() == {
        "train.steps": 300,
        "train.eval_batches": 32,
        "model.preset": "small",
        "train.eval_interval": 10_000_000,
    }
