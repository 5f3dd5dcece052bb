"""Settings every trainer of a run must share, checked by a volunteer before it downloads or trains.

Each training peer publishes, in its signed peer record, the settings its rounds depend on: strategy,
its sync period (``inner_steps``, where it has one), codec, reducer and the ``f`` it tolerates. A
volunteer whose own differ would otherwise fail every round (or, for a reducer, reduce differently
from the others) and say so only after minutes. Before anything else it compares its settings with
the live trainers' records:

* every trainer that published a setting agrees on a value this volunteer does not have: one line,
  ``ConfigError`` (exit 2), naming the run's value and the flag that sets it;
* trainers disagree among themselves (a run being changed, or records written to confuse): a
  warning naming the values, and the volunteer goes on (its rounds then say the rest).

Refusing only on unanimity keeps a stranger's records from turning honest volunteers away: one honest
trainer that shares this volunteer's settings is enough to let it in.

Where a run has a manifest signed by its run key, the manifest is the source of truth: ``swarmtrain
join`` takes the run-wide settings from it and refuses any that differ before the peer starts
(``swarmtrain.app.peer.run_manifest``), so this check then finds the trainers agreeing with it. This
check runs in every run; in a run without a manifest it is the only one.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from peers.trust.manifest import PUBLISHED
from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError

__all__ = ["run_settings", "check_agreement", "SETTING_FLAGS"]

logger = logging.getLogger(__name__)

#: setting name in the record -> how a volunteer sets it (``peers.trust.manifest.PUBLISHED``: the
#: run-wide settings a training peer publishes)
SETTING_FLAGS: dict[str, str] = {name: s.how or s.key for name, s in PUBLISHED.items()}

#: the strategies whose rounds depend on the sync period ``inner_steps`` (only they publish it)
_PERIODIC = ("diloco", "streaming_diloco")


def run_settings(cfg: Config) -> dict[str, str | int]:
    """The settings a peer publishes in its record (``extra``) for others to check against: the
    :data:`peers.trust.manifest.PUBLISHED` ones its config has."""
    config = cfg.model_dump(mode="json")
    out: dict[str, str | int] = {}
    for name, setting in PUBLISHED.items():
        section, _, key = setting.key.partition(".")
        value = config[section].get(key)
        if value is not None and (name != "inner_steps" or cfg.strategy.name in _PERIODIC):
            out[name] = value
    return out


def check_agreement(ours: dict[str, str | int], records: list[Any], own_id: str) -> None:
    """Compare ``ours`` with the live trainers' published settings (see the module docstring).

    Args:
        ours: this peer's :func:`run_settings`.
        records: the run's live peer records (``peers.dht.records.PeerRecord``).
        own_id: this peer's ID (its own record is skipped).

    Raises:
        ConfigError: every trainer that published a setting agrees on another value than ours.
    """
    others = [r for r in records if r.role == "trainer" and r.peer_id != own_id]
    for key, flag in SETTING_FLAGS.items():
        seen = Counter(r.extra[key] for r in others if key in r.extra)
        if not seen:
            continue
        mine = ours.get(key)
        if len(seen) == 1:
            ((theirs, n),) = seen.items()
            if theirs != mine:
                raise ConfigError(
                    f"this run's trainers use {key} {theirs!r} ({n} of {n}); this peer is set to "
                    f"{mine!r}: join with {flag} {theirs} (or the run's config file)"
                )
            continue
        values = ", ".join(f"{v!r} ({c})" for v, c in seen.most_common())
        logger.warning("the run's trainers disagree on %s: %s; this peer uses %r", key, values, mine)
