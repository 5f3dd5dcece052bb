"""``swarmtrain.connect`` refuses bad options with one-line ``ConfigError`` s before any node starts
(the two-peer run itself is ``tests/integration/test_own_model_example.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import swarmtrain


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"inner_steps": 0}, "inner_steps"),
        ({"fragments": 2}, "streaming_diloco"),  # another strategy's option
        ({"strategy": "nope"}, "unknown strategy"),
        ({"compression": "zstd"}, "unknown codec"),
        ({"min_peers": 0}, "min_peers"),
        ({"min_peers": 3, "expected_peers": 2}, "expected_peers"),
        ({"port": 70000}, "port"),
        ({"run_id": "bad id!"}, "run_id"),
    ],
)
def test_bad_options_are_one_line_config_errors(options: dict[str, Any], says: str) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kw: dict[str, Any] = {"run_id": "connect-test", **options}
    with pytest.raises(swarmtrain.ConfigError) as err:
        swarmtrain.connect(model, opt, **kw)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_public_names() -> None:
    assert {"connect", "SwarmPeer", "spawn_function"} <= set(swarmtrain.__all__)
    assert swarmtrain.connect.__module__ == "swarmtrain.app.peer.connect"
