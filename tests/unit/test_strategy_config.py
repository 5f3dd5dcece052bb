"""Per-strategy options: one frozen model per strategy, chosen by ``strategy.name``, validated once."""

from __future__ import annotations

import logging
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from optimizers import STRATEGIES, DiLoCo, StrategyContext, build_strategy
from optimizers.demo_payload import VALUE_MODES
from swarmtrain.app.cli import run
from swarmtrain.core.config import (
    STRATEGY_CONFIGS,
    CompressionConfig,
    Config,
    DataParallelConfig,
    DeMoConfig,
    DiLoCoConfig,
    LocalConfig,
    StreamingDiLoCoConfig,
    load_config,
    strategy_config,
)
from swarmtrain.core.errors import ConfigError

OWN_OPTIONS = {
    "local": set(),
    "data_parallel": {"sync_timeout"},
    "diloco": {"sync_timeout", "inner_steps", "outer_lr", "outer_momentum", "nesterov", "outer_state"},
    "streaming_diloco": {
        "sync_timeout",
        "inner_steps",
        "outer_lr",
        "outer_momentum",
        "nesterov",
        "outer_state",
        "fragments",
        "overlap",
        "mixing",
    },
    "demo": {"sync_timeout", "demo_chunk", "demo_topk", "demo_decay", "demo_sign", "demo_values"},
}


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_each_strategy_has_only_its_own_options() -> None:
    assert set(STRATEGY_CONFIGS) == set(STRATEGIES.names())
    for name, model in STRATEGY_CONFIGS.items():
        assert set(model.model_fields) - {"name"} == OWN_OPTIONS[name], name
        assert model.model_fields["name"].default == name


def test_demo_value_modes_match_the_payload_codec() -> None:
    assert typing.get_args(DeMoConfig.model_fields["demo_values"].annotation) == VALUE_MODES


def test_strategy_options_are_frozen() -> None:
    cfg = load_config(overrides={"strategy.name": "diloco", "strategy.inner_steps": 5}, env={})
    assert isinstance(cfg.strategy, DiLoCoConfig) and cfg.strategy.inner_steps == 5
    with pytest.raises(ValidationError):
        cfg.strategy.inner_steps = 6  # type: ignore[misc]


def test_name_selects_the_model_and_defaults_to_local() -> None:
    assert isinstance(Config().strategy, LocalConfig)
    assert isinstance(Config(strategy={}).strategy, LocalConfig)  # type: ignore[arg-type]
    for name, model in STRATEGY_CONFIGS.items():
        cfg = load_config(overrides={"strategy.name": name}, env={})
        assert type(cfg.strategy) is model
        assert Config.model_validate_json(cfg.model_dump_json()) == cfg


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            {"strategy.name": "diloco", "strategy.demo_chunk": 8},
            "strategy.demo_chunk is not an option of strategy 'diloco' (it belongs to: demo)",
        ),
        (
            {"strategy.name": "data_parallel", "strategy.inner_steps": 5},
            "strategy.inner_steps is not an option of strategy 'data_parallel' "
            "(it belongs to: diloco, streaming_diloco)",
        ),
        (
            {"strategy.fragments": 2},
            "strategy.fragments is not an option of strategy 'local' (it belongs to: streaming_diloco)",
        ),
        (
            {"strategy.name": "nosuch"},
            "strategy.name: unknown strategy 'nosuch'; choose one of: local, data_parallel, diloco, "
            "streaming_diloco, demo",
        ),
    ],
)
def test_an_option_of_another_strategy_is_one_line(overrides: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(overrides=overrides, env={})
    assert str(ei.value) == line


def test_an_option_of_another_strategy_in_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "[strategy]\nname = 'diloco'\ninner_steps = 8\ndemo_topk = 2\n")
    with pytest.raises(ConfigError, match=r"^strategy.demo_topk is not an option of strategy 'diloco'"):
        load_config(path, env={})
    # options of the strategy a lower layer selected are errors when a higher layer sets them
    with pytest.raises(ConfigError, match=r"^strategy.inner_steps is not an option of strategy 'demo'"):
        load_config(None, {"strategy.inner_steps": 3}, env={"SWARMTRAIN_STRATEGY__NAME": "demo"})


def test_a_higher_layer_that_switches_strategy_drops_lower_layers_options(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _write(tmp_path, "[strategy]\nname = 'diloco'\ninner_steps = 8\nsync_timeout = 9.0\n")
    with caplog.at_level(logging.WARNING, logger="swarmtrain.core.config"):
        cfg = load_config(path, {"strategy.name": "demo", "strategy.demo_topk": 2}, env={})
    assert cfg.strategy == DeMoConfig(demo_topk=2, sync_timeout=9.0)  # the shared option is kept
    assert "strategy.inner_steps is not an option of strategy 'demo'" in caplog.text
    assert "the config file" in caplog.text
    env = {"SWARMTRAIN_STRATEGY__FRAGMENTS": "2"}
    cfg = load_config(path, {"strategy.name": "diloco"}, env=env)
    assert cfg.strategy == DiLoCoConfig(inner_steps=8, sync_timeout=9.0)


def test_base_layer_options_of_another_strategy_are_dropped_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a checkpoint saved before strategies had their own models holds every strategy's options
    flat = {
        "name": "diloco",
        "inner_steps": 7,
        "outer_lr": 0.7,
        "outer_momentum": 0.9,
        "nesterov": True,
        "fragments": 4,
        "overlap": 1,
        "mixing": 0.5,
        "demo_chunk": 64,
        "demo_topk": 4,
        "demo_decay": 0.999,
        "demo_sign": True,
        "demo_values": "fp16",
        "sync_timeout": 60.0,
    }
    with caplog.at_level(logging.WARNING, logger="swarmtrain.core.config"):
        cfg = load_config(None, {"train.steps": 3}, env={}, base={"strategy": flat})
        assert cfg.strategy == DiLoCoConfig(inner_steps=7, outer_lr=0.7, outer_momentum=0.9)
        # simulate's defaults (diloco, H=30) sit in the base layer: any --strategy replaces them
        cfg = load_config(None, {"strategy.name": "data_parallel"}, env={}, base={"strategy": flat})
        assert cfg.strategy == DataParallelConfig()
    assert caplog.text == ""


def test_cross_field_checks_live_in_the_owning_model() -> None:
    with pytest.raises(ValidationError, match=r"fragments \(5\) must be <= inner_steps \(4\)"):
        StreamingDiLoCoConfig(inner_steps=4, fragments=5)
    with pytest.raises(ValidationError, match=r"overlap \(3\) must be <= inner_steps // fragments \(2\)"):
        StreamingDiLoCoConfig(inner_steps=8, fragments=4, overlap=3)
    with pytest.raises(ValidationError, match=r"demo_topk \(10\) exceeds the 3x3"):
        DeMoConfig(demo_chunk=3, demo_topk=10)
    with pytest.raises(ConfigError, match=r"^strategy: demo_topk \(10\) exceeds the 3x3"):
        demo = {"strategy.name": "demo", "strategy.demo_chunk": 3, "strategy.demo_topk": 10}
        load_config(overrides=demo, env={})
    # the checks of one strategy do not apply to another
    assert DiLoCoConfig(inner_steps=1).inner_steps == 1


def test_strategy_config_builds_by_name_with_the_same_rules() -> None:
    assert strategy_config("streaming_diloco", inner_steps=8, fragments=2) == StreamingDiLoCoConfig(
        inner_steps=8, fragments=2
    )
    with pytest.raises(ConfigError, match=r"^strategy.inner_steps: Input should be greater"):
        strategy_config("diloco", inner_steps=0)
    with pytest.raises(ConfigError, match=r"^strategy.mixing is not an option of strategy 'diloco'"):
        strategy_config("diloco", mixing=0.5)
    with pytest.raises(ConfigError, match=r"^unknown strategy 'dilco'"):
        strategy_config("dilco")
    with pytest.raises(ValidationError, match="not an option of strategy 'demo'"):
        DeMoConfig(inner_steps=3)  # type: ignore[call-arg]


def test_a_strategy_refuses_another_strategys_options() -> None:
    model = torch.nn.Linear(2, 2)
    ctx = StrategyContext(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        config=DeMoConfig(),
        compression=CompressionConfig(),
    )
    with pytest.raises(ConfigError, match="DeMoConfig.*DiLoCoConfig"):
        DiLoCo(ctx)
    local = StrategyContext(model, ctx.optimizer, LocalConfig(), CompressionConfig())
    assert build_strategy(local).name == "local"


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in out + err and len(lines) == 1, err
    return lines[0]


def test_cli_flag_of_another_strategy_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["simulate", "--steps", "1", "--strategy", "data_parallel", "-H", "5"]) == 2
    assert _one_error_line(capsys) == (
        "swarmtrain: error: strategy.inner_steps is not an option of strategy 'data_parallel' "
        "(it belongs to: diloco, streaming_diloco)"
    )
    assert run(["simulate", "--steps", "1", "--strategy", "demo", "--fragments", "2"]) == 2
    assert "strategy.fragments is not an option of strategy 'demo'" in _one_error_line(capsys)
