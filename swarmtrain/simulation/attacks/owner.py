"""Owner-level attack: a partition owner of the butterfly all-reduce that returns a wrong aggregate.

The network collective calls ``corrupt_aggregate`` on the owner's result before sending it back; the
defence is the owner check of issue 6 point 4 (a reducer cannot help: the reducer runs on the owner).
"""

from __future__ import annotations

from typing import Any

import torch

from swarmtrain.core.errors import ConfigError
from swarmtrain.simulation.attacks.base import ATTACKS, Attack

__all__ = ["MaliciousOwner"]

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
