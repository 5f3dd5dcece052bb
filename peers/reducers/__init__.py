"""Reducers: combine one flat row per peer into one aggregate (pure functions of the stack).

Registered by name in ``REDUCERS``; the partition owner in the all-reduce applies one. Robust ones
(Byzantine-tolerant averaging): ``coordinate_median``, ``trimmed_mean`` (Yin et al. 2018),
``centered_clip`` (Karimireddy et al. 2021; BTARD, Gorbunov et al. 2022), ``krum``/``multi_krum``
(Blanchard et al. 2017) and ``geometric_median`` (Weiszfeld; RFA, Pillutla et al. 2022). Each states
its breakdown point and refuses an ``(n, f)`` beyond it with ``ConfigError``.
"""

from __future__ import annotations

from typing import Any

from peers.reducers.base import REDUCERS, BaseReducer
from peers.reducers.centered_clip import CenteredClip
from peers.reducers.geomedian import GeometricMedian
from peers.reducers.krum import Krum, MultiKrum, krum_scores
from peers.reducers.mean import MeanReducer
from peers.reducers.median import CoordinateMedian
from peers.reducers.trimmed import TrimmedMean
from swarmtrain.core.errors import ConfigError

__all__ = [
    "REDUCERS",
    "BaseReducer",
    "MeanReducer",
    "CoordinateMedian",
    "TrimmedMean",
    "CenteredClip",
    "Krum",
    "MultiKrum",
    "GeometricMedian",
    "krum_scores",
    "build_reducer",
]


def build_reducer(name: str, n_byzantine: int = 0, **options: Any) -> BaseReducer:
    """Instantiate the reducer ``name`` for ``n_byzantine`` tolerated attackers.

    Args:
        name: a ``REDUCERS`` name (``mean``, ``coordinate_median``, ``trimmed_mean``,
            ``centered_clip``, ``krum``, ``multi_krum``, ``geometric_median``).
        n_byzantine: ``f``, the number of Byzantine peers the reducer must tolerate.
        **options: reducer-specific options (e.g. ``tau`` and ``max_iters`` for ``centered_clip``).

    Raises:
        ConfigError: unknown name, unknown option, or a bad value.
    """
    cls = REDUCERS.get(name)
    try:
        reducer = cls(n_byzantine=n_byzantine, **options)
    except TypeError as e:
        raise ConfigError(f"reducer {name!r}: bad options {sorted(options)}: {e}") from None
    if not isinstance(reducer, BaseReducer):  # pragma: no cover - a registry bug
        raise ConfigError(f"reducer {name!r} is not a BaseReducer")
    return reducer
