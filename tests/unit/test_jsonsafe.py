"""JSON outputs never hold NaN or Infinity (``swarmtrain.core.jsonsafe``)."""

from __future__ import annotations

import json
import math

from swarmtrain.core.jsonsafe import dumps, finite


def test_non_finite_floats_become_null_at_any_depth() -> None:
    obj = {"loss": math.nan, "rows": [1.0, math.inf, {"x": -math.inf}], "t": (2.5, math.nan), "n": 3}
    assert finite(obj) == {"loss": None, "rows": [1.0, None, {"x": None}], "t": [2.5, None], "n": 3}
    text = dumps(obj)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text)["loss"] is None
