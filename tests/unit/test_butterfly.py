"""Pure helpers of the butterfly data phase (``peers.rounds.butterfly``): partition bounds, the in-place
weighted mean against ``MeanReducer``, and the flat input view."""

from __future__ import annotations

import pytest
import torch

from peers.reducers import MeanReducer
from peers.rounds.butterfly import _flat, _mean_into, bounds
from peers.rounds.weights import bound_weights, over_cap
from swarmtrain.core.errors import ConfigError


@pytest.mark.parametrize(("n", "parts"), [(0, 3), (1, 4), (10, 3), (1001, 4), (2**20 + 5, 7)])
def test_bounds_cover_contiguously_and_evenly(n: int, parts: int) -> None:
    b = bounds(n, parts)
    assert len(b) == parts and b[0][0] == 0 and b[-1][1] == n
    assert all(b[i][1] == b[i + 1][0] for i in range(parts - 1))
    sizes = [hi - lo for lo, hi in b]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_mean_into_matches_the_mean_reducer() -> None:
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(10_001, generator=g) * (i + 1) for i in range(4)]
    weights = [1.0, 2.5, 0.0, 7.0]
    acc = torch.empty(10_001)
    got = _mean_into(acc, rows, weights)
    assert got.data_ptr() == acc.data_ptr()  # in place, no [n, m] stack
    ref = MeanReducer().reduce(torch.stack(rows), torch.tensor(weights))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weights", [[0.0, 0.0], [float("inf"), 1.0]])
def test_mean_into_refuses_weights_the_reducer_refuses(weights: list[float]) -> None:
    rows = [torch.ones(3), torch.ones(3)]
    with pytest.raises(ConfigError):
        _mean_into(torch.empty(3), rows, weights)


def test_flat_is_a_view_of_one_fp32_tensor_and_a_copy_otherwise() -> None:
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    f = _flat({"x": x}, ["x"])
    assert f.shape == (12,) and f.data_ptr() == x.data_ptr()
    h = torch.ones(5, dtype=torch.bfloat16)
    f2 = _flat({"x": x, "h": h}, ["x", "h"])
    assert f2.dtype == torch.float32 and f2.shape == (17,)
    assert torch.equal(f2[:12], x.reshape(-1)) and torch.equal(f2[12:], torch.ones(5))
    assert _flat({}, []).numel() == 0


def test_claimed_weights_are_capped_at_twice_the_lower_median() -> None:
    assert bound_weights([1.0, 1.0, 1.0, 1e30]) == [1.0, 1.0, 1.0, 2.0]
    assert bound_weights([1.0, 2.0, 3.0]) == [1.0, 2.0, 3.0]  # within 2x of the median: unchanged
    assert bound_weights([4.0, 1.0]) == [2.0, 1.0]  # two members: the lower median, not their mean
    assert bound_weights([0.0, 0.0]) == [0.0, 0.0]  # nothing positive: left to the reducer's check
    assert bound_weights([0.0, 3.0, 1e9]) == [0.0, 3.0, 6.0]


def test_a_weight_over_the_cap_is_seen_before_the_cap_and_never_after() -> None:
    """``over_cap`` is what a run counts (``weights_over_cap``): the intruder control reduces weights
    as claimed, and must show the in-group weight attack that the cap stops."""
    for weights in ([1.0, 1.0, 1.0, 1e30], [0.0, 3.0, 1e9], [4.0, 1.0]):
        assert over_cap(weights) and not over_cap(bound_weights(weights))
    assert not over_cap([1.0, 2.0, 2.0]) and not over_cap([]) and not over_cap([0.0])
