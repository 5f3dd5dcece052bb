"""The layers ``swarmtrain.core.config.load_config`` merges: the TOML file, the ``SWARMTRAIN_*``
environment and the CLI's dotted overrides, each read into nested tables (not validated here)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from swarmtrain.core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["ENV_PREFIX", "NON_CONFIG_ENV", "deep_merge", "env_layer", "dotted_layer", "file_layer"]

ENV_PREFIX = "SWARMTRAIN_"
# SWARMTRAIN_* variables that are switches of their own, not config fields. Any other variable with
# the prefix must be SECTION__FIELD, so a typo like SWARMTRAIN_LR is an error, not silently ignored.
NON_CONFIG_ENV = frozenset(
    {
        "SWARMTRAIN_PEER_MARKER",  # peers.dht.process: marks the processes of a peer we started
        "SWARMTRAIN_COMPILE_CODECS",  # compression: 0 disables torch.compile of codec kernels
        "SWARMTRAIN_COMPILE_MIN_NUMEL",  # compression: size above which kernels are compiled
        "SWARMTRAIN_WAN",  # tests: opt into the network-namespace tests
        "SWARMTRAIN_LONG_TESTS",  # tests: opt into the tests too long for CI's budget
        "SWARMTRAIN_WAN_LOG",  # benchmarks: log level of WAN peer workers
        "SWARMTRAIN_NATIVE_CODECS",  # compression.native: 0 disables the C codec kernel
        "SWARMTRAIN_NATIVE_DIR",  # compression.native: where the C kernel is built
        "SWARMTRAIN_KEEP_HEAP",  # peers.wire.memory: 0 lets glibc return freed round buffers
    }
)


def deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, table by table."""
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def _parse_env_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def env_layer(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``SWARMTRAIN_<SECTION>__<FIELD>`` variables of ``env`` as tables (values parsed as TOML)."""
    layer: dict[str, Any] = {}
    for key, raw in env.items():
        if not key.startswith(ENV_PREFIX) or key in NON_CONFIG_ENV:
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        if len(path) != 2 or not all(path):
            raise ConfigError(f"environment variable {key}: expected {ENV_PREFIX}<SECTION>__<FIELD>")
        layer.setdefault(path[0], {})[path[1]] = _parse_env_value(raw)
    return layer


def dotted_layer(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``{"section.field": value}`` as tables; ``None`` values (a flag not given) are left out."""
    layer: dict[str, Any] = {}
    for dotted, value in overrides.items():
        if value is None:
            continue
        parts = dotted.split(".")
        if len(parts) != 2:
            raise ConfigError(f"override {dotted!r}: expected 'section.field'")
        layer.setdefault(parts[0], {})[parts[1]] = value
    return layer


def file_layer(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML file at ``path`` (one line naming the problem when it cannot be read or parsed)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {p} cannot be read: {e}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
