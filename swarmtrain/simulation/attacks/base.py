"""The attack interface and registry: Byzantine behaviours for research and tests.

An ``Attack`` is one attacking peer's behaviour. It has three hooks, called by the simulation or the
collective at the points where a real attacker could act; each defaults to honest behaviour:

* ``transform_batch(inputs, targets)``: poison this peer's training data (label flip);
* ``forge(own, honest)``: replace the update this peer sends (sign flip, ALIE, IPM, ...);
* ``corrupt_aggregate(aggregate, stack)``: as a partition owner, return a wrong aggregate;
* ``claim_weight(weight)``: the weight this peer claims for its update (the tokens behind it).

Attacks are never used by honest code paths; they exist so that reducers, owner checks and bans can
be tested against them. Stateful attacks (``stale``) keep their memory per instance: build one
instance per attacking peer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from swarmtrain.core.errors import ConfigError
from swarmtrain.core.registry import Registry

__all__ = ["ATTACKS", "Attack", "build_attack", "forge_rows", "check_update"]

ATTACKS: Registry[type] = Registry("attack")


def check_update(own: torch.Tensor, honest: torch.Tensor | None = None) -> None:
    """Validate a flat update ``[m]`` and, if given, an honest stack ``[k, m]`` of the same width."""
    if not isinstance(own, torch.Tensor) or own.dim() != 1 or not own.is_floating_point():
        raise ConfigError("attack: the update must be a flat floating-point [m] tensor")
    if honest is not None:
        if not isinstance(honest, torch.Tensor) or honest.dim() != 2 or honest.shape[1] != own.shape[0]:
            raise ConfigError("attack: honest updates must be a [k, m] tensor matching the update")
        if honest.shape[0] == 0:
            raise ConfigError("attack: honest updates are empty")


@ATTACKS.register("none")
class Attack:
    """Honest behaviour; the base class of every attack (override the hooks you need).

    Class attributes:
        omniscient: ``forge`` needs ``honest`` (the updates of the honest peers).
        data_level: the attack acts through ``transform_batch``.
        owner_level: the attack acts through ``corrupt_aggregate``.
    """

    name = "none"
    omniscient = False
    data_level = False
    owner_level = False

    def forge(
        self,
        own: torch.Tensor,
        honest: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """The update to send instead of ``own`` ``[m]`` (the honest update this peer computed).

        Args:
            own: this peer's honest update ``[m]``.
            honest: ``[k, m]`` honest updates an omniscient attacker sees (simulation only).
            generator: randomness for randomised attacks (CPU generator).
        """
        check_update(own, honest)
        return own.clone()

    def transform_batch(
        self, inputs: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Poison one training batch; honest: unchanged."""
        return inputs, targets

    def corrupt_aggregate(
        self,
        aggregate: torch.Tensor,
        stack: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """What this peer, as a partition owner, returns instead of ``aggregate``; honest: unchanged."""
        return aggregate

    def claim_weight(self, weight: float) -> float:
        """The weight this peer claims for its update instead of ``weight``; honest: unchanged."""
        return weight

    def state_dict(self) -> dict[str, Any]:
        """Options, for logs and benchmark JSON."""
        return {"name": self.name}

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.state_dict().items() if k != "name")
        return f"{type(self).__name__}({opts})"


def build_attack(name: str, **options: Any) -> Attack:
    """Instantiate the attack ``name`` with its options.

    Raises:
        ConfigError: unknown name, unknown option, or a bad value.
    """
    cls = ATTACKS.get(name)
    try:
        attack = cls(**options)
    except TypeError as e:
        raise ConfigError(f"attack {name!r}: bad options {sorted(options)}: {e}") from None
    if not isinstance(attack, Attack):  # pragma: no cover - a registry bug
        raise ConfigError(f"attack {name!r} is not an Attack")
    return attack


def forge_rows(
    updates: torch.Tensor,
    attackers: Mapping[int, Attack] | Sequence[tuple[int, Attack]],
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Simulate an omniscient attack on a stack of honest updates.

    Args:
        updates: ``[n, m]`` the update each peer computed honestly (label-flipping attackers computed
            theirs on poisoned data already).
        attackers: row index -> that peer's ``Attack``.
        generator: randomness shared by the randomised attacks.

    Returns:
        ``[n, m]``: honest rows unchanged, attacker rows forged. Omniscient attacks see the rows of
        the peers that are not attackers.
    """
    items = list(attackers.items()) if isinstance(attackers, Mapping) else list(attackers)
    n = updates.shape[0]
    bad = {i for i, _ in items}
    if any(not 0 <= i < n for i in bad):
        raise ConfigError(f"attack: attacker rows {sorted(bad)} out of range for {n} peers")
    honest_idx = [i for i in range(n) if i not in bad]
    honest = updates[honest_idx] if honest_idx else None
    out = updates.clone()
    for i, attack in items:
        view = honest if attack.omniscient else None
        if attack.omniscient and view is None:
            raise ConfigError(f"attack {attack.name!r} needs at least one honest peer")
        out[i] = attack.forge(updates[i], view, generator=generator)
    return out
