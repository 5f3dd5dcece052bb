"""``AttackingCollective``: make one real peer Byzantine by wrapping its ``Collective``.

The wrapper forges what this peer contributes to every ``all_reduce`` with an update-level attack
(``sign_flip``, ``random_direction``, ``gaussian_noise``, ``stale``, ``alie``, ``ipm``), one attack
instance per tensor name so that stateful attacks keep a separate memory per tensor. Everything else
passes through.

ALIE and IPM are omniscient in their papers; a real peer never sees the honest updates, so here they
run on what colluding attackers can know: before each round the attackers all-gather their own
honest updates over a side channel (``swarmtrain.simulation.attacks.collusion.Colluders``) and the
attack uses those rows as its estimate of the honest ones.

Out of its reach, on purpose: ``label_flip`` acts on the training batches (``PoisonedBatches`` around
the trainer's sampler, wired by ``swarmtrain.simulation.wiring``); ``malicious_owner`` acts on the
aggregates a partition owner returns (``MaliciousOwnerReducer`` around its reducer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import Collective, Compressor, GatherResult, Reducer, RoundResult
from swarmtrain.simulation.attacks.base import Attack, build_attack
from swarmtrain.simulation.attacks.collusion import Colluders

__all__ = ["AttackingCollective"]


class AttackingCollective:
    """A ``Collective`` whose ``all_reduce`` contributions are forged by the attack ``name``.

    Args:
        inner: this peer's real collective.
        name: an update-level ``ATTACKS`` name.
        options: the attack's options.
        seed: seed of the randomised attacks.
        colluders: the attackers' side channel, used by attacks that need an estimate of the honest
            updates (``alie``, ``ipm``); ``None``: this peer's own update is the whole estimate.

    Raises:
        ConfigError: unknown attack, bad options, or an attack that cannot act through the update.
    """

    def __init__(
        self,
        inner: Collective,
        name: str,
        options: Mapping[str, Any] | None = None,
        seed: int = 0,
        colluders: Colluders | None = None,
    ):
        self._inner = inner
        self._name = name
        self._options = dict(options or {})
        probe = build_attack(name, **self._options)
        if probe.data_level or probe.owner_level:
            raise ConfigError(f"attack {name!r} does not act on the update; wire its own hook instead")
        self._omniscient = bool(probe.omniscient)
        self._probe = probe
        self._colluders = colluders if colluders is not None else Colluders(None)
        self._attacks: dict[str, Attack] = {}
        self._generator = torch.Generator().manual_seed(int(seed))

    @property
    def peer_id(self) -> str:
        return self._inner.peer_id

    def all_reduce(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        compressor: Compressor,
        reducer: Reducer | None = None,
        weight: float = 1.0,
        timeout: float = 60.0,
        kind: str = "reduce",
    ) -> RoundResult:
        """Forge every tensor of this peer, then take part in the round as usual.

        ``alie``/``ipm`` first exchange the honest updates with the other colluders (``[k, m]`` per
        tensor, this peer's own row included) and forge from those.
        """
        for key, t in tensors.items():
            if not t.is_floating_point():
                raise ConfigError(f"AttackingCollective: tensor {key!r} is not floating point")
        estimate = self._colluders.share(tensors) if self._omniscient else {}
        forged: dict[str, torch.Tensor] = {}
        for key, t in tensors.items():
            attack = self._attacks.get(key)
            if attack is None:
                attack = self._attacks[key] = build_attack(self._name, **self._options)
            flat = t.detach().reshape(-1)
            rows = estimate.get(key)
            honest = rows.to(device=flat.device, dtype=flat.dtype) if rows is not None else None
            forged[key] = attack.forge(flat, honest, generator=self._generator).reshape(t.shape).to(t.dtype)
        claimed = self._probe.claim_weight(weight)
        return self._inner.all_reduce(
            forged, compressor=compressor, reducer=reducer, weight=claimed, timeout=timeout, kind=kind
        )

    def all_gather(self, payload: bytes, *, timeout: float = 60.0, kind: str = "gather") -> GatherResult:
        """Passed through unchanged."""
        return self._inner.all_gather(payload, timeout=timeout, kind=kind)

    @property
    def colluders(self) -> Colluders:
        """The side channel of the omniscient attacks (exchange counters for logs and tests)."""
        return self._colluders

    def close(self) -> None:
        """Close the side channel and the inner collective (if they can be closed)."""
        self._colluders.close()
        close = getattr(self._inner, "close", None)
        if callable(close):
            close()
