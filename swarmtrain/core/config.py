"""Run configuration: pydantic models, loaded from a TOML file, ``SWARMTRAIN_*`` env vars and CLI flags.

Precedence, lowest to highest: model defaults < TOML file < environment < CLI overrides. Env vars
name a field by its section and field joined with a double underscore, e.g.
``SWARMTRAIN_TRAIN__LR=3e-4`` or ``SWARMTRAIN_STRATEGY__NAME=diloco``; values are parsed as TOML
scalars/arrays when they parse, else taken as strings. Every validation failure becomes one
``ConfigError`` line naming the field.

``[strategy]`` is a discriminated union on ``name``: each strategy has its own frozen model
(``DiLoCoConfig``, ``DeMoConfig``, ...; ``swarmtrain.core.strategy_config``) holding only its options,
validated once here, so the strategies in ``optimizers`` trust what they are given. An option of
another strategy is one line naming the strategies it belongs to.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from swarmtrain.core.config_layers import ENV_PREFIX, deep_merge, dotted_layer, env_layer, file_layer
from swarmtrain.core.config_moves import check_moved, move_keys
from swarmtrain.core.data_source import drop_stale_source, infer_data_source
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.strategy_config import (
    STRATEGY_CONFIGS,
    BaseStrategyConfig,
    DataParallelConfig,
    DeMoConfig,
    DiLoCoConfig,
    LocalConfig,
    OuterLoopConfig,
    StrategyConfig,
    StreamingDiLoCoConfig,
    SyncedStrategyConfig,
    foreign_option_message,
    strategies_with_option,
    unknown_strategy_message,
)
from swarmtrain.core.swarm_config import SwarmConfig

__all__ = [
    "RUN_ID_PATTERN",
    "ModelConfig",
    "DataConfig",
    "TrainConfig",
    "StrategyConfig",
    "BaseStrategyConfig",
    "SyncedStrategyConfig",
    "OuterLoopConfig",
    "LocalConfig",
    "DataParallelConfig",
    "DiLoCoConfig",
    "StreamingDiLoCoConfig",
    "DeMoConfig",
    "STRATEGY_CONFIGS",
    "strategy_config",
    "strategies_with_option",
    "foreign_option_message",
    "unknown_strategy_message",
    "CompressionConfig",
    "PeersConfig",
    "SimulationConfig",
    "SwarmConfig",
    "Config",
    "load_config",
    "format_validation_error",
    "ENV_PREFIX",
]

#: what a run ID may be: it names DHT keys and files, so no separators or control characters
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")

log = logging.getLogger(__name__)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class ModelConfig(_Section):
    """Which byte-level GPT to train."""

    preset: Literal["tiny", "small", "gpt2-124m"] = "tiny"
    block_size: int | None = Field(default=None, ge=8, le=8192, description="context length override")
    n_layer: int | None = Field(default=None, ge=1, le=96, description="layer count override")
    n_head: int | None = Field(default=None, ge=1, le=128, description="attention heads override")
    n_embd: int | None = Field(default=None, ge=8, le=16384, description="width override")
    vocab_size: int | None = Field(
        default=None, ge=2, le=1 << 17, description="None: 256 for bytes, from the data for token files"
    )
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)


class DataConfig(_Section):
    """Where training bytes come from.

    ``source``: ``stdlib`` (the Python standard library's sources, present on every install),
    ``text`` (files/folders in ``paths``) or ``bin`` (nanoGPT-style uint16 token files in ``paths``).
    """

    source: Literal["stdlib", "text", "bin"] = "stdlib"
    paths: list[str] = Field(default_factory=list)
    val_fraction: float = Field(default=0.02, gt=0.0, lt=0.5)
    max_bytes: int | None = Field(default=None, ge=1024, description="cap on corpus bytes read")
    cache_dir: str | None = Field(
        default=None, description="where the stdlib corpus is cached (None: $XDG_CACHE_HOME/swarmtrain)"
    )

    @model_validator(mode="after")
    def _infer_source(self) -> DataConfig:
        """``paths`` without an explicit ``source`` names the user's data: token files -> ``bin``, else
        ``text``; an explicit ``stdlib`` beside paths is an error (they would be silently unused)."""
        if self.paths and "source" not in self.model_fields_set:
            # written around __setattr__: assignment would validate again, and recurse
            self.__dict__["source"] = infer_data_source(self.paths)
        elif self.source == "stdlib" and self.paths:
            raise ValueError(
                "paths given but source is stdlib: drop source (text or bin is inferred) or the paths"
            )
        return self


class TrainConfig(_Section):
    """The local training loop."""

    device: str = "auto"
    threads: int | None = Field(
        default=None, ge=1, le=1024, description="torch CPU threads (None: torch's default, one per core)"
    )
    seed: int = 0
    steps: int = Field(default=200, ge=1)
    max_time: float | None = Field(default=None, gt=0, description="stop after this many seconds")
    batch_size: int = Field(default=16, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    optimizer: Literal["adamw", "adamw8bit", "sgd"] = Field(
        default="adamw", description="inner optimizer; adamw8bit keeps 8-bit states (needs bitsandbytes)"
    )
    lr: float = Field(default=1e-3, gt=0)
    min_lr: float = Field(default=1e-4, ge=0)
    warmup_steps: int = Field(default=20, ge=0)
    weight_decay: float = Field(default=0.1, ge=0)
    beta1: float = Field(default=0.9, ge=0, lt=1)
    beta2: float = Field(default=0.95, ge=0, lt=1)
    grad_clip: float | None = Field(default=1.0, gt=0)
    compile: bool = False
    bf16: Literal["auto", "on", "off"] = "auto"
    eval_interval: int = Field(default=100, ge=1)
    eval_batches: int = Field(default=8, ge=1)
    log_interval: int = Field(default=10, ge=1)
    out_dir: str = "runs/default"
    checkpoint_interval: int | None = Field(default=None, ge=1)
    progress: bool = True


class CompressionConfig(_Section):
    """How strategies compress what they send (names are ``compression`` registry names)."""

    codec: str = "none"
    block_size: int = Field(default=256, ge=8, le=1 << 20)
    topk_fraction: float = Field(default=0.01, gt=0, le=1)
    error_feedback: Literal["none", "ef", "ef21"] = "none"
    options: dict[str, int | float | str | bool] = Field(
        default_factory=dict, description="codec options, e.g. {block = 64}; topk+X: k, fraction go to top-k"
    )


def strategy_config(name: str, **options: Any) -> StrategyConfig:
    """Build and validate the config of strategy ``name`` from keyword options.

    Raises:
        ConfigError: unknown name, an option the strategy does not have, or a bad value (one line).
    """
    model = STRATEGY_CONFIGS.get(name)
    if model is None:
        raise ConfigError(unknown_strategy_message(name))
    for key in options:
        msg = foreign_option_message(name, key)
        if msg is not None:
            raise ConfigError(msg)
    try:
        # every STRATEGY_CONFIGS value is one member of the StrategyConfig union
        return cast(StrategyConfig, model.model_validate(options))
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, prefix="strategy")) from None


class PeersConfig(_Section):
    """Networking: DHT, identity, rounds, robust aggregation."""

    run_id: str = "swarmtrain"
    initial_peers: list[str] = Field(default_factory=list)
    host_maddrs: list[str] = Field(default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"])
    announce_maddrs: list[str] = Field(default_factory=list)
    identity_path: str | None = None
    identity_check: bool = Field(default=True, description="at start, check no live peer uses this identity")
    region: str = "unknown"
    min_peers: int = Field(default=1, ge=1)
    round_timeout: float = Field(default=60.0, gt=0)
    give_up_after: float = Field(
        default=300.0,
        ge=0,
        description="a volunteer stops (exit 1) after this many seconds of failed rounds and no "
        "committed one; 0: never",
    )
    join_window: float = Field(
        default=3.0, gt=0, le=600, description="seconds a round's leader waits for late joiners"
    )
    preempt_grace: float = Field(
        default=25.0,
        gt=0,
        le=3600,
        description="seconds from SIGTERM to exit: finish the outer step if it fits, hand the state "
        "to a live peer, leave (a spot instance's notice)",
    )
    reducer: str = "mean"
    byzantine_f: int = Field(default=0, ge=0, description="peers the reducer must tolerate")
    reducer_options: dict[str, float | int] = Field(
        default_factory=dict, description="options of the reducer, e.g. {tau = 1.0, max_iters = 20}"
    )
    owner_check: bool = Field(
        default=False,
        description="replicated-owner check, signed suspicion records and bans",
    )
    ban_strikes: int = Field(default=3, ge=1, description="outlier rounds an accuser needs before it counts")
    admission: Literal["open", "allowlist", "token"] = Field(
        default="open", description="who may take part: anyone, the allowlist, or holders of a join token"
    )
    allowlist: list[str] = Field(default_factory=list, description="admitted peer IDs (admission allowlist)")
    run_public_key: str | None = Field(
        default=None, description="the run key's public half, 64 hex digits (admission token)"
    )
    token: str | None = Field(default=None, description="this peer's join token (admission token)")
    state_upload_mib_s: float = Field(default=64.0, ge=0, description="a donor's state upload cap; 0: none")
    state_vouchers: int = Field(
        default=2, ge=1, le=16, description="donors that must vouch for a downloaded state (fewer if fewer)"
    )
    manifest: str | None = Field(
        default=None, description="the signed run manifest file (`swarmtrain run init`), served to newcomers"
    )
    open_unprotected: bool = Field(
        default=False,
        description="allow admission 'open' with a non-robust reducer (any stranger can move the mean)",
    )


class SimulationConfig(_Section):
    """Faults and adversaries that ``swarmtrain simulate`` makes on purpose (never read by a volunteer)."""

    attack: str = Field(default="none", description="the name of the attack attackers run")
    attackers: int = Field(default=0, ge=0, description="how many peers attack (--byzantine K)")
    attack_options: dict[str, float | int | str] = Field(
        default_factory=dict, description="options of the attack, e.g. {scale = 4.0}"
    )
    malicious_owners: int = Field(
        default=0, ge=0, description="ranks after the attackers that return wrong aggregates"
    )


class Config(_Section):
    """The whole run configuration."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    strategy: StrategyConfig = Field(default_factory=LocalConfig)
    compression: CompressionConfig = Field(default_factory=CompressionConfig)
    peers: PeersConfig = Field(default_factory=PeersConfig)
    simulation: SimulationConfig = Field(default_factory=SimulationConfig)
    swarm: SwarmConfig = Field(default_factory=SwarmConfig)

    @field_validator("strategy", mode="before")
    @classmethod
    def _default_strategy_name(cls, value: Any) -> Any:
        """A ``[strategy]`` table without ``name`` means ``local``; an unknown name is one clear line."""
        if isinstance(value, Mapping):
            name = value.get("name", "local")
            if name not in STRATEGY_CONFIGS:
                raise ValueError(unknown_strategy_message(name))
            return {**value, "name": name}
        return value


def _error_loc(loc: tuple[int | str, ...], prefix: str) -> str:
    """Dotted field path; the strategy-name tag pydantic puts after ``strategy`` is left out."""
    parts = [str(x) for x in loc]
    if parts[:1] == ["strategy"] and len(parts) > 1 and parts[1] in STRATEGY_CONFIGS:
        del parts[1]
    if prefix:
        parts.insert(0, prefix)
    return ".".join(parts) or "config"


def format_validation_error(e: ValidationError, prefix: str = "") -> str:
    """One line naming the first bad field (and how many more there are).

    Args:
        e: the pydantic error.
        prefix: section name to put before the field when ``e`` comes from a section model alone.
    """
    errs = e.errors()
    first = errs[0]
    # a validator's ValueError reads as its own message, without pydantic's "Value error, "
    msg = f"{_error_loc(first['loc'], prefix)}: {first['msg'].removeprefix('Value error, ')}"
    if "input" in first and not isinstance(first["input"], dict):
        msg += f" (got {first['input']!r})"
    if len(errs) > 1:
        msg += f" (and {len(errs) - 1} more problem{'s' if len(errs) > 2 else ''})"
    return msg


# where each layer of ``load_config`` comes from, lowest first (named in messages)
_BASE, _FILE, _ENV, _CLI = "base", "the config file", "the environment", "the command line"


def _resolve_strategy(layers: list[tuple[str, Mapping[str, Any]]]) -> dict[str, Any] | None:
    """Merge the ``[strategy]`` tables of ``layers`` (lowest first) for the strategy they select.

    The highest layer that sets ``strategy.name`` selects the strategy. An option of another
    strategy set in that layer or above is an error: the user asked for both. One set below it is
    dropped (logged): a lower layer configured the strategy it selected, and a higher one switched
    strategy, e.g. ``--strategy demo`` over a file written for ``diloco``. The ``base`` layer (program
    defaults, a checkpoint's saved config) never causes an error. Options no strategy has are kept,
    so the model reports them as unknown fields.

    Returns:
        The merged table, or ``None`` when no layer has one (or one is not a table: the model
        reports it).

    Raises:
        ConfigError: an unknown strategy name, or another strategy's option (one line).
    """
    tables = [(src, layer.get("strategy")) for src, layer in layers]
    if not any(isinstance(t, Mapping) for _, t in tables) or any(
        t is not None and not isinstance(t, Mapping) for _, t in tables
    ):
        return None
    named = [(i, t["name"]) for i, (_, t) in enumerate(tables) if isinstance(t, Mapping) and "name" in t]
    at, name = named[-1] if named else (-1, "local")
    if name not in STRATEGY_CONFIGS:
        raise ConfigError(f"strategy.name: {unknown_strategy_message(name)}")
    merged: dict[str, Any] = {}
    for i, (src, table) in enumerate(tables):
        for key, value in dict(table or {}).items():
            msg = foreign_option_message(name, str(key))
            if msg is None:
                merged[key] = value
            elif i >= at and src != _BASE:
                raise ConfigError(msg)
            elif src != _BASE:
                log.warning("%s; ignoring the value from %s", msg, src)
    return {**merged, "name": name}


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    base: Mapping[str, Any] | None = None,
) -> Config:
    """Build a validated ``Config``.

    Layers, lowest first: ``base``, the file, the environment, ``overrides``. The highest layer
    that sets ``strategy.name`` selects the strategy; another strategy's option set in that layer or
    above is an error, one set below it is dropped with a warning (``base``: silently).

    Args:
        path: optional TOML file with ``[model]``, ``[train]``, ... tables.
        overrides: CLI values as ``{"train.lr": 3e-4}``; ``None`` values are ignored (flag not given).
        env: the environment to read ``SWARMTRAIN_*`` from (``os.environ`` by default).
        base: a lowest layer below the file, e.g. the config saved in a checkpoint being resumed.

    Raises:
        ConfigError: one line naming the problem.
    """
    layers: list[tuple[str, Mapping[str, Any]]] = [(_BASE, move_keys(base or {}))]
    if path is not None:
        layers.append((_FILE, file_layer(path)))
    layers.append((_ENV, env_layer(os.environ if env is None else env)))
    layers.append((_CLI, dotted_layer(overrides or {})))
    data: dict[str, Any] = {}
    for src, layer in layers:
        if src != _BASE:
            check_moved(layer)
        data = deep_merge(data, layer)
    strategy = _resolve_strategy(layers)
    if strategy is not None:
        data["strategy"] = strategy
    drop_stale_source(layers, data)
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None
