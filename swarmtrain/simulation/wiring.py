"""The faults one simulated rank runs, as hooks of the app's peer loop (``swarmtrain.app.peer.loop``).

``cfg.simulation`` says who attacks: ranks ``0..K-1`` run ``attack`` (``--byzantine K``), the next
``malicious_owners`` ranks return wrong aggregates as partition owners (with ``--attack
malicious_owner`` the first ``K`` do). An update-level attack wraps the collective
(``AttackingCollective``; ALIE and IPM attackers share their honest updates over a side channel,
``Colluders``); a data-level one wraps the trainer's batches (``PoisonedBatches``); a bad owner's
reducer is wrapped by ``install_malicious_owner``. The peer loop itself stays attack-free.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from swarmtrain.app.peer.loop import PeerHooks
from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import Reducer

__all__ = [
    "RankWiring",
    "attack_options",
    "check_attack_fits_strategy",
    "install_malicious_owner",
    "is_bad_owner",
]

#: strategies that exchange payloads by all-gather (no partition owners, no all-reduce contributions)
_GATHER_STRATEGIES = ("demo",)
_OWNER = "malicious_owner"


def attack_options(cfg: Config, n_peers: int) -> dict[str, Any]:
    """The attack's options as configured, plus what a real run knows: ALIE's ``n`` and ``f``."""
    options: dict[str, Any] = dict(cfg.simulation.attack_options)
    if cfg.simulation.attack == "alie" and "z" not in options:
        options.setdefault("n_peers", n_peers)
        options.setdefault("n_byzantine", max(1, cfg.simulation.attackers))
    return options


def _update_attacker(cfg: Config, rank: int) -> bool:
    """Whether ``rank`` runs ``cfg.simulation.attack`` on its updates or its data."""
    sim = cfg.simulation
    return rank < sim.attackers and sim.attack not in ("none", _OWNER)


def is_bad_owner(cfg: Config, rank: int) -> bool:
    """Whether ``rank`` returns wrong aggregates: ranks K..K+M-1 after K update attackers, or the first
    K ranks with ``--attack malicious_owner``."""
    sim = cfg.simulation
    first = sim.attackers if sim.attack not in ("none", _OWNER) else 0
    return first <= rank < first + sim.malicious_owners or (sim.attack == _OWNER and rank < sim.attackers)


def check_attack_fits_strategy(cfg: Config) -> None:
    """Refuse an attack that would silently do nothing under ``cfg.strategy.name``.

    Update-level attacks forge all-reduce contributions and ``malicious_owner`` corrupts a partition
    owner's aggregate; DeMo has neither (its sparse DCT payloads travel by all-gather), so with DeMo
    only the data-level ``label_flip`` acts.

    Raises:
        ConfigError: the attack cannot act on this strategy.
    """
    from swarmtrain.simulation.attacks import build_attack

    sim = cfg.simulation
    if not sim.attackers and not sim.malicious_owners:
        return
    if cfg.strategy.name not in _GATHER_STRATEGIES:
        return
    owner = sim.malicious_owners > 0 or sim.attack == _OWNER
    update = sim.attackers > 0 and sim.attack not in ("none", _OWNER)
    if update and build_attack(sim.attack, **dict(sim.attack_options)).data_level:
        update = False
    if owner or update:
        name = _OWNER if owner else sim.attack
        raise ConfigError(
            f"attack {name!r} cannot act on strategy {cfg.strategy.name!r}: it exchanges sparse "
            "components by all-gather, with no all-reduce contributions or partition owners "
            "(use --attack label_flip, or a reduce-based strategy)"
        )


def install_malicious_owner(cfg: Config, rank: int, hooks: PeerHooks) -> PeerHooks:
    """Make ``rank`` a partition owner that corrupts the aggregates it returns: the reducer its
    strategy hands to ``all_reduce`` is wrapped in a ``MaliciousOwnerReducer`` (``mode`` and ``scale``
    from ``cfg.simulation.attack_options``)."""
    from swarmtrain.simulation.attacks.owner import MaliciousOwnerReducer

    opts = cfg.simulation.attack_options
    mode, scale = str(opts.get("mode", "sign_flip")), opts.get("scale", 1.0)
    if isinstance(scale, str):
        raise ConfigError(f"attack 'malicious_owner': scale must be a number, got {scale!r}")

    def wrap(reducer: Reducer) -> Reducer:
        return MaliciousOwnerReducer(reducer, seed=rank, mode=mode, scale=float(scale))

    return replace(hooks, wrap_reducer=wrap)


class RankWiring:
    """Builds the peer-loop hooks of one simulated rank and keeps what its attacks did.

    Args:
        cfg: the run's configuration (``cfg.simulation`` names the attacks).
        rank: this peer's rank.
        n_peers: peers in the run (ALIE derives its ``z`` from it).
    """

    def __init__(self, cfg: Config, rank: int, n_peers: int) -> None:
        from swarmtrain.simulation.attacks import build_attack

        self.cfg, self.rank = cfg, rank
        self.options = attack_options(cfg, n_peers)
        attacking = _update_attacker(cfg, rank)
        self.data_attack = attacking and bool(build_attack(cfg.simulation.attack, **self.options).data_level)
        self.update_attack = attacking and not self.data_attack
        self.bad_owner = is_bad_owner(cfg, rank)
        self._collective: Any = None
        self._poisoned: Any = None

    def hooks(self) -> PeerHooks:
        """The hooks that install this rank's attacks (none for an honest rank)."""
        hooks = PeerHooks(
            wrap_collective=self._forge_updates if self.update_attack else None,
            wrap_batches=self._poison_batches if self.data_attack else None,
        )
        return install_malicious_owner(self.cfg, self.rank, hooks) if self.bad_owner else hooks

    def stats(self) -> dict[str, int]:
        """What the attacks did: poisoned batches, collusion exchanges and failed exchanges."""
        stats: dict[str, int] = {}
        if self._poisoned is not None:
            stats["poisoned_batches"] = int(self._poisoned.batches)
        colluders = getattr(self._collective, "colluders", None)
        if colluders is not None:
            stats["collusion_exchanges"] = int(colluders.exchanges)
            stats["collusion_failed"] = int(colluders.failed)
        return stats

    def _forge_updates(self, node: Any, inner: Any) -> Any:
        """Wrap ``inner`` so this peer forges its updates; ALIE/IPM attackers share a side channel.

        The colluders' channel is a second ``P2PCollective`` on the same node in its own rounds
        namespace (``<run>.colluders``), joined by the attackers only; each attacker calls it once per
        round.
        """
        from peers import P2PCollective
        from swarmtrain.simulation.attacks import AttackingCollective, Colluders, build_attack

        cfg, channel = self.cfg, None
        k = cfg.simulation.attackers
        if build_attack(cfg.simulation.attack, **self.options).omniscient and k >= 2:
            channel = P2PCollective(
                node,
                run_id=f"{node.run_id}.colluders",
                min_peers=k,
                expected_peers=k,
                join_window=cfg.peers.join_window,
            )
        colluders = Colluders(channel, timeout=min(10.0, cfg.peers.round_timeout))
        self._collective = AttackingCollective(
            inner, cfg.simulation.attack, self.options, seed=self.rank, colluders=colluders
        )
        return self._collective

    def _poison_batches(self, sampler: Any, vocab_size: int) -> Any:
        """Train on poisoned batches (same interface as the sampler; the trainer stays attack-free)."""
        from swarmtrain.simulation.attacks import PoisonedBatches, build_attack

        self.options.setdefault("vocab_size", vocab_size)
        self._poisoned = PoisonedBatches(sampler, build_attack(self.cfg.simulation.attack, **self.options))
        return self._poisoned
