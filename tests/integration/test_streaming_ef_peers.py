"""Streaming DiLoCo with int8 + error feedback between 2 real peer processes on 127.0.0.1 (issue 16.2).

The butterfly keyed error-feedback residuals by position (``reduce/{size}/{i}/{c}``), so all
fragments used the same slots: the first fragment to sync claimed them with its shapes and every
round of a fragment of another size then failed inside the round with a shape error, while the run
still reported identical parameters (that fragment's global parameters never moved from the initial
ones on any peer). Equal-size fragments silently shared residuals (``tests/unit/test_ef_keys.py``).
Now residuals are keyed by the fragment's tensors, every fragment commits, and the report counts
rounds per fragment.
"""

from __future__ import annotations

from typing import Any

import pytest

from swarmtrain.core.config import load_config
from swarmtrain.simulation.runner import run_simulation

FRAGMENTS = 3


@pytest.mark.timeout(300)
def test_every_fragment_commits_with_error_feedback_on_real_peers() -> None:
    overrides: dict[str, Any] = {
        "strategy.name": "streaming_diloco",
        "strategy.inner_steps": 3,
        "strategy.fragments": FRAGMENTS,
        "strategy.overlap": 0,
        "compression.codec": "int8",
        "compression.error_feedback": "ef",
        "train.steps": 6,  # two syncs of each fragment
        "train.batch_size": 4,
        # the tiny GPT at context 64 in 3 fragments: 278102, 278102 and 278100 elements, so with 2
        # peers fragment 2's partitions are one element shorter than the others' (positional keys:
        # a shape error in every round of one of them); fragments 0 and 1 are of equal size
        "model.block_size": 64,
        "train.eval_interval": 10_000,
        "train.log_interval": 4,
        "peers.min_peers": 2,
    }
    res = run_simulation(load_config(None, overrides, env={}), 2, timeout=240.0)
    per_fragment = res.rounds_per_fragment
    assert sorted(per_fragment) == list(range(FRAGMENTS)), per_fragment
    for o in res.outcomes:  # each peer committed rounds of every fragment
        committed = {f: c["committed"] for f, c in o.fragment_rounds.items()}
        assert all(committed.get(f, 0) >= 1 for f in range(FRAGMENTS)), (o.rank, o.fragment_rounds)
    assert res.stalled_fragments == []
    assert res.params_identical
    assert res.summary()["rounds_per_fragment"] == per_fragment
