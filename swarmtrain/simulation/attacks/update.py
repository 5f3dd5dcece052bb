"""Update-level Byzantine attacks: what an attacking peer sends instead of its honest update.

* ``sign_flip``: ``-scale * own`` (BTARD's "sign flipping", scaled so that a minority can outweigh
  the honest peers under the plain mean).
* ``random_direction``: all attackers send ``scale * ||own||`` along one common random direction
  (BTARD's "random direction"); the direction is fixed by ``seed`` so attackers agree without talking.
* ``gaussian_noise``: pure noise ``N(0, (scale * rms(own))^2)`` instead of the update.
* ``alie``: "A Little Is Enough" (Baruch, Baruch, Goldberg 2019): ``mean - z * std`` of the honest
  updates, coordinate-wise, with ``z`` from the paper's formula for ``n`` peers and ``f`` attackers.
* ``ipm``: inner-product manipulation (Xie, Koyejo, Gupta 2020, "Fall of Empires"):
  ``-epsilon * mean(honest)``.
* ``stale``: replay this peer's own update from ``delay`` rounds ago (delayed gradients).
* ``inflated_weight``: the honest update, with a claimed weight of ``weight`` (1e30): uncapped, the
  weighted mean is this peer's row alone (the owners' cap in ``peers.rounds.butterfly`` bounds it).
"""

from __future__ import annotations

import math
from collections import deque
from statistics import NormalDist
from typing import Any

import torch

from swarmtrain.core.errors import ConfigError
from swarmtrain.simulation.attacks.base import ATTACKS, Attack, check_update

__all__ = ["SignFlip", "RandomDirection", "GaussianNoise", "ALIE", "IPM", "Stale", "InflatedWeight", "alie_z"]


def _positive(label: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"attack option {label} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"attack option {label} must be a positive finite number, got {value!r}")
    return float(value)


def _rms(t: torch.Tensor) -> float:
    return float(t.double().square().mean().sqrt()) if t.numel() else 0.0


@ATTACKS.register("sign_flip")
class SignFlip(Attack):
    """Send ``-scale * own``.

    Args:
        scale: magnitude factor (default 4: with 7 of 16 attackers the mean becomes
            ``(9 - 7*4)/16 = -1.19`` times the honest update, i.e. training runs backwards).
    """

    name = "sign_flip"

    def __init__(self, scale: float = 4.0) -> None:
        self.scale = _positive("scale", scale)

    def forge(
        self,
        own: torch.Tensor,
        honest: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        check_update(own, honest)
        return own * -self.scale

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scale": self.scale}


@ATTACKS.register("random_direction")
class RandomDirection(Attack):
    """Send ``scale * ||own||`` times a unit vector drawn once from ``seed`` (shared by all attackers).

    A fixed common direction is the strong form of the attack: the attackers' pushes add up and do
    not average out over rounds.

    Args:
        scale: norm relative to the honest update's norm (default 10).
        seed: seed of the common direction (attackers with the same seed agree).
    """

    name = "random_direction"

    def __init__(self, scale: float = 10.0, seed: int = 0) -> None:
        self.scale = _positive("scale", scale)
        self.seed = int(seed)
        self._direction: torch.Tensor | None = None

    def direction(self, m: int) -> torch.Tensor:
        """The shared unit direction for updates of length ``m`` (CPU, float64)."""
        if self._direction is None or self._direction.shape[0] != m:
            g = torch.Generator().manual_seed(self.seed)
            d = torch.randn(m, generator=g, dtype=torch.float64)
            self._direction = d / d.norm().clamp_min(1e-300)
        return self._direction

    def forge(
        self,
        own: torch.Tensor,
        honest: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        check_update(own, honest)
        norm = float(own.double().norm()) * self.scale
        return (self.direction(own.shape[0]) * norm).to(device=own.device, dtype=own.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scale": self.scale, "seed": self.seed}


@ATTACKS.register("gaussian_noise")
class GaussianNoise(Attack):
    """Send ``N(0, (scale * rms(own))^2)`` noise instead of the update.

    Args:
        scale: noise standard deviation relative to the update's root-mean-square (default 10).
        seed: seed used when ``forge`` gets no generator.
    """

    name = "gaussian_noise"

    def __init__(self, scale: float = 10.0, seed: int = 0) -> None:
        self.scale = _positive("scale", scale)
        self._generator = torch.Generator().manual_seed(int(seed))

    def forge(
        self,
        own: torch.Tensor,
        honest: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        check_update(own, honest)
        g = self._generator if generator is None else generator
        noise = torch.randn(own.shape[0], generator=g, dtype=torch.float64) * (self.scale * _rms(own))
        return noise.to(device=own.device, dtype=own.dtype)

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "scale": self.scale}


def alie_z(n_peers: int, n_byzantine: int) -> float:
    """``z_max`` of Baruch et al. 2019: ``s = floor(n/2 + 1) - f``, ``z = Phi^-1((n - s) / n)``.

    ``s`` is how many honest peers the attackers need to "recruit" for a majority; the attack moves
    each coordinate by ``z`` standard deviations, no further than the farthest of those ``s`` peers is
    expected to be. For ``s <= 0`` (attackers alone are a majority) ``z`` is capped at 3.
    """
    if n_peers < 2 or not 0 < n_byzantine < n_peers:
        raise ConfigError(f"alie: need 0 < f < n and n >= 2, got n={n_peers}, f={n_byzantine}")
    s = math.floor(n_peers / 2 + 1) - n_byzantine
    p = (n_peers - s) / n_peers
    if p >= 1.0:
        return 3.0
    return max(0.0, NormalDist().inv_cdf(p))


@ATTACKS.register("alie")
class ALIE(Attack):
    """A Little Is Enough: send ``mean(honest) - z * std(honest)`` (coordinate-wise).

    Small enough per coordinate to pass median- and distance-based filters, consistent enough across
    coordinates and rounds to steer training. Needs the honest updates (``omniscient``).

    Args:
        n_peers: ``n``, peers in the round (for the default ``z``).
        n_byzantine: ``f``, attackers in the round (for the default ``z``).
        z: override the paper's ``z_max``.
    """

    name = "alie"
    omniscient = True

    def __init__(self, n_peers: int = 16, n_byzantine: int = 7, z: float | None = None) -> None:
        self.z = alie_z(int(n_peers), int(n_byzantine)) if z is None else float(z)
        if not math.isfinite(self.z) or self.z < 0:
            raise ConfigError(f"alie: z must be finite and >= 0, got {z!r}")

    def forge(
        self,
        own: torch.Tensor,
        honest: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        check_update(own, honest)
        if honest is None:
            raise ConfigError("attack 'alie' needs the honest updates")
        h = honest.to(own.dtype)
        return h.mean(dim=0) - self.z * h.std(dim=0, correction=0)

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "z": self.z}


@ATTACKS.register("ipm")
class IPM(Attack):
    """Inner-product manipulation: send ``-epsilon * mean(honest)``.

    Its inner product with the honest mean is ``-epsilon * ||mean||^2 < 0``. Small ``epsilon``
    (0.1-0.5) hides among honest updates and targets median/Krum; ``epsilon > (n - f) / f`` turns the
    plain mean around (default 2: enough for 3 of 8 and 7 of 16).

    Args:
        epsilon: strength (default 2).
    """

    name = "ipm"
    omniscient = True

    def __init__(self, epsilon: float = 2.0) -> None:
        self.epsilon = _positive("epsilon", epsilon)

    def forge(
        self,
        own: torch.Tensor,
        honest: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        check_update(own, honest)
        if honest is None:
            raise ConfigError("attack 'ipm' needs the honest updates")
        return honest.to(own.dtype).mean(dim=0) * -self.epsilon

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "epsilon": self.epsilon}


@ATTACKS.register("stale")
class Stale(Attack):
    """Send this peer's own update from ``delay`` rounds ago (the oldest one kept, while warming up).

    Stateful: one instance per attacking peer; it keeps ``delay + 1`` past updates.

    Args:
        delay: rounds of delay (default 10).
    """

    name = "stale"

    def __init__(self, delay: int = 10) -> None:
        if isinstance(delay, bool) or not isinstance(delay, int) or delay < 1:
            raise ConfigError(f"attack 'stale': delay must be an int >= 1, got {delay!r}")
        self.delay = delay
        self._past: deque[torch.Tensor] = deque(maxlen=delay + 1)

    def forge(
        self,
        own: torch.Tensor,
        honest: torch.Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        check_update(own, honest)
        if self._past and self._past[0].shape != own.shape:
            self._past.clear()  # a different tensor than before: start over
        self._past.append(own.detach().clone())
        return self._past[0].clone()

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "delay": self.delay}


@ATTACKS.register("inflated_weight")
class InflatedWeight(Attack):
    """Send the honest update, claiming ``weight`` for it (the tokens behind an update are what a
    sender says they are).

    Args:
        weight: the weight claimed in every round (default 1e30).
    """

    name = "inflated_weight"

    def __init__(self, weight: float = 1e30) -> None:
        self.weight = _positive("weight", weight)

    def claim_weight(self, weight: float) -> float:
        return self.weight

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight}
