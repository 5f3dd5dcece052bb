"""Owner-level attack: a partition owner of the butterfly all-reduce that returns a wrong aggregate.

``MaliciousOwner`` holds the corruption (``corrupt_aggregate``); ``MaliciousOwnerReducer`` installs it
in a real peer by wrapping the reducer the peer passes to ``all_reduce``, so the network collective
runs no attack code of its own. The defence is the replicated-owner check (``peers.trust.verify``); a robust
reducer cannot help, since the reducer runs on the owner.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import Reducer
from swarmtrain.simulation.attacks.base import ATTACKS, Attack

__all__ = ["MaliciousOwner", "MaliciousOwnerReducer"]

_MODES = ("sign_flip", "random", "zero")


@ATTACKS.register("malicious_owner")
class MaliciousOwner(Attack):
    """Contribute honestly but, as a partition owner, corrupt the aggregate.

    Modes: ``sign_flip`` returns ``-scale * aggregate``; ``random`` returns Gaussian noise with
    ``scale`` times the aggregate's norm; ``zero`` returns zeros (silently drops the partition's
    update).

    Args:
        mode: one of ``sign_flip``, ``random``, ``zero``.
        scale: magnitude factor (default 1).
        seed: seed used when ``corrupt_aggregate`` gets no generator.
    """

    name = "malicious_owner"
    owner_level = True

    def __init__(self, mode: str = "sign_flip", scale: float = 1.0, seed: int = 0) -> None:
        if mode not in _MODES:
            raise ConfigError(f"attack 'malicious_owner': mode must be one of {_MODES}, got {mode!r}")
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not scale > 0:
            raise ConfigError(f"attack 'malicious_owner': scale must be > 0, got {scale!r}")
        self.mode = mode
        self.scale = float(scale)
        self._generator = torch.Generator().manual_seed(int(seed))

    def corrupt_aggregate(
        self,
        aggregate: torch.Tensor,
        stack: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        if self.mode == "zero":
            return torch.zeros_like(aggregate)
        if self.mode == "sign_flip":
            return aggregate * -self.scale
        g = self._generator if generator is None else generator
        noise = torch.randn(aggregate.shape, generator=g, dtype=torch.float64)
        noise *= self.scale * float(aggregate.double().norm()) / max(float(noise.norm()), 1e-300)
        return noise.to(device=aggregate.device, dtype=aggregate.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "scale": self.scale}


class MaliciousOwnerReducer:
    """A reducer whose ``reduce`` returns a corrupted aggregate: a peer that passes it to
    ``P2PCollective.all_reduce`` is a malicious partition owner.

    A peer reduces with it only as a *primary* owner (the aggregates it returns to the others). As a
    *verifier* of another owner's partition the owner check reduces with ``honest`` (the undecorated
    reducer, see ``peers.rounds.owner_check.honest_reducer``), so this peer lies about its own partition
    only, as a single Byzantine owner does.

    ``n_byzantine`` and every other attribute of ``inner`` read through, and ``n_byzantine`` writes
    through (a copy copies ``inner`` too), so the collective can fit ``f`` to the group as it does for
    ``inner``.

    Args:
        inner: the honest reducer.
        seed: seed of the ``random`` mode's noise.
        mode: ``sign_flip``, ``random`` or ``zero`` (see :class:`MaliciousOwner`).
        scale: magnitude factor.

    Raises:
        ConfigError: unknown mode or a scale <= 0.
    """

    def __init__(self, inner: Reducer, *, seed: int = 0, mode: str = "sign_flip", scale: float = 1.0) -> None:
        self.inner = inner
        self.attack = MaliciousOwner(mode, scale, seed)
        self.name = f"malicious_owner/{inner.name}"

    @property
    def honest(self) -> Reducer:
        """The undecorated reducer a verifier replicates."""
        return self.inner

    @property
    def n_byzantine(self) -> Any:
        """``inner.n_byzantine`` (``None`` when it has none)."""
        return getattr(self.inner, "n_byzantine", None)

    @n_byzantine.setter
    def n_byzantine(self, value: int) -> None:
        self.inner.n_byzantine = value  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __copy__(self) -> MaliciousOwnerReducer:
        out = object.__new__(MaliciousOwnerReducer)
        out.__dict__.update(self.__dict__)
        out.inner = copy.copy(self.inner)  # the attack (its noise generator) stays shared
        return out

    def reduce(self, stack: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """The honest aggregate of ``stack`` ``[n, m]``, corrupted (``[m]``)."""
        return self.attack.corrupt_aggregate(self.inner.reduce(stack, weights))
