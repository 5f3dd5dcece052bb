"""Byzantine attacks for research and tests, registered by name in ``ATTACKS``.

Update level: ``sign_flip``, ``random_direction``, ``gaussian_noise``, ``alie`` (Baruch et al. 2019),
``ipm`` (Xie et al. 2020), ``stale``. Data level: ``label_flip``. Owner level: ``malicious_owner``
(``MaliciousOwnerReducer`` installs it in a real peer).
``none`` is honest behaviour. ``AttackingCollective`` makes a real peer run an update-level attack
(ALIE and IPM estimate the honest updates from the colluders' own, ``Colluders``); ``PoisonedBatches``
makes it train on poisoned data.
"""

from __future__ import annotations

from swarmtrain.simulation.attacks.base import ATTACKS, Attack, build_attack, check_update, forge_rows
from swarmtrain.simulation.attacks.collective import AttackingCollective
from swarmtrain.simulation.attacks.collusion import Colluders, decode_rows, encode_rows
from swarmtrain.simulation.attacks.data import LabelFlip, PoisonedBatches, flip_labels
from swarmtrain.simulation.attacks.owner import MaliciousOwner, MaliciousOwnerReducer
from swarmtrain.simulation.attacks.update import (
    ALIE,
    IPM,
    GaussianNoise,
    RandomDirection,
    SignFlip,
    Stale,
    alie_z,
)

__all__ = [
    "ATTACKS",
    "Attack",
    "build_attack",
    "check_update",
    "forge_rows",
    "AttackingCollective",
    "Colluders",
    "encode_rows",
    "decode_rows",
    "PoisonedBatches",
    "SignFlip",
    "RandomDirection",
    "GaussianNoise",
    "ALIE",
    "IPM",
    "Stale",
    "alie_z",
    "LabelFlip",
    "flip_labels",
    "MaliciousOwner",
    "MaliciousOwnerReducer",
]
