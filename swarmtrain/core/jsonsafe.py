"""JSON that stays standard: non-finite floats (a diverged loss, a run stopped before any eval)
become ``null`` instead of ``NaN``/``Infinity``, which strict JSON readers refuse."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["finite", "dumps"]


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float, at any depth of dicts, lists and tuples, as ``None``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps`` of :func:`finite` ``(obj)``; raises ``ValueError`` rather than write ``NaN``."""
    return json.dumps(finite(obj), allow_nan=False, **kw)
