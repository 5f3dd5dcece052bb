"""Config keys that moved to another section between releases (``load_config`` reads old files).

A file, the environment or a flag that sets a moved key gets one line naming its new place; the
``base`` layer (a checkpoint's saved config, written by an older release) is moved silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swarmtrain.core.errors import ConfigError

__all__ = ["MOVED", "move_keys", "check_moved"]

# keys that moved to another section: (old section, old key) -> new "section.key"
MOVED: dict[tuple[str, str], str] = {
    ("peers", "attack"): "simulation.attack",
    ("peers", "attackers"): "simulation.attackers",
    ("peers", "attack_options"): "simulation.attack_options",
    ("peers", "malicious_owners"): "simulation.malicious_owners",
}


def move_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every moved key in its new place: the ``base`` layer (a checkpoint's saved
    config) was written by an older version, not by the user, so it moves silently."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for (section, key), new in MOVED.items():
        table = out.get(section)
        if isinstance(table, dict) and key in table:
            new_section, new_key = new.split(".")
            value = table.pop(key)
            target = out.setdefault(new_section, {})
            if isinstance(target, dict):
                target.setdefault(new_key, value)
    return out


def check_moved(data: Mapping[str, Any]) -> None:
    """One clear line for a key that an older config wrote in another section."""
    for (section, key), new in MOVED.items():
        table = data.get(section)
        if isinstance(table, Mapping) and key in table:
            raise ConfigError(f"{section}.{key} has moved: write it as {new}")
