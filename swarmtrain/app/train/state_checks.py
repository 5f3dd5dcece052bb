"""Checks a state must pass before it is loaded into a trainer (a checkpoint or a peer's download).

Every check only reads; a state that fails one changes nothing. The errors are ``CheckpointError``,
which the peer-state exchange turns into ``ProtocolError``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from swarmtrain.app.train.checkpoint import CheckpointError

__all__ = ["check_fits", "check_finite_state"]

#: state entries that must not be negative: step counters, and second moments (AdamW's ``exp_avg_sq``;
#: bitsandbytes keeps its 8-bit codes unsigned and the fp32 fallback under ``state2``)
_NON_NEGATIVE = frozenset({"step", "exp_avg_sq", "state2"})


def check_finite_state(tree: Any, what: str) -> None:
    """Raise CheckpointError if a floating tensor or number in ``tree`` is NaN or infinite, or an
    entry named in ``_NON_NEGATIVE`` is negative (a step of -1 or a negative second moment turns the
    next update into NaN)."""
    stack: list[tuple[str, Any]] = [("", tree)]
    while stack:
        key, cur = stack.pop()
        if isinstance(cur, Mapping):
            stack.extend((str(k), v) for k, v in cur.items())
        elif isinstance(cur, list | tuple):
            stack.extend((key, v) for v in cur)
        elif isinstance(cur, torch.Tensor):
            if cur.is_floating_point() and not bool(torch.isfinite(cur).all()):
                raise CheckpointError(f"{what} holds NaN or infinite values")
            if (
                key in _NON_NEGATIVE
                and cur.numel()
                and not cur.dtype == torch.uint8
                and bool((cur < 0).any())
            ):
                raise CheckpointError(f"{what}: {key} is negative")
        elif isinstance(cur, float) and not math.isfinite(cur):
            raise CheckpointError(f"{what} holds a NaN or infinite number")
        elif isinstance(cur, int | float) and key in _NON_NEGATIVE and cur < 0:
            raise CheckpointError(f"{what}: {key} is negative")


def check_fits(ours: Mapping[str, torch.Tensor], theirs: Mapping[str, Any]) -> None:
    """Raise CheckpointError unless ``theirs`` has exactly ``ours``' names, each a tensor of the same
    shape and dtype (checked before anything is copied, so a bad state changes nothing)."""
    if set(theirs) != set(ours):
        missing, extra = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
        raise CheckpointError(f"model tensors differ (missing {missing[:3]}, unexpected {extra[:3]})")
    for name, t in ours.items():
        src = theirs[name]
        if not isinstance(src, torch.Tensor) or src.shape != t.shape or src.dtype != t.dtype:
            raise CheckpointError(f"tensor {name} does not fit this model ({tuple(t.shape)} {t.dtype})")
