"""The owners' cap on the weights senders claim for their rows (tokens processed since their last sync).

Both reductions of a chunk apply it: the owner's (``peers.rounds.butterfly``) and its verifier's
(``peers.rounds.owner_check``), which must reduce exactly as an honest owner does. They call it
through this module (``weights.bound_weights``), so that an intruder run's control can turn it off
in one place.
"""

from __future__ import annotations

__all__ = ["WEIGHT_CAP", "bound_weights", "over_cap"]

#: a sender's weight counts at most this many times the median weight of the chunk's rows
WEIGHT_CAP = 2.0


def bound_weights(weights: list[float]) -> list[float]:
    """``weights`` with each capped at :data:`WEIGHT_CAP` times the median of the positive ones.

    Uncapped, one member claiming 1e30 makes the weighted mean its own row. Honest weights are equal
    under one run config (up to a factor 2 after a failed round), so the cap leaves them as they are;
    a claimant's share of the mean is bounded by ``WEIGHT_CAP / (n - 1 + WEIGHT_CAP)``. Bounding is
    not robustness: that is the robust reducers' job (they ignore weights).
    """
    cap = _cap(weights)
    return weights if cap is None else [min(w, cap) for w in weights]


def _cap(weights: list[float]) -> float | None:
    """:data:`WEIGHT_CAP` times the lower median of the positive weights (no average of two); None:
    none is positive."""
    positive = sorted(w for w in weights if w > 0)
    return WEIGHT_CAP * positive[(len(positive) - 1) // 2] if positive else None


def over_cap(weights: list[float]) -> bool:
    """Whether a weight of ``weights`` (as reduced) is above :data:`WEIGHT_CAP` times the lower median
    of the positive ones: never after :func:`bound_weights`; counted per round (``weights_over_cap``
    in the collective's ``counters``) so a run can show the cap held."""
    cap = _cap(weights)
    return cap is not None and max(weights) > cap * (1 + 1e-9)
