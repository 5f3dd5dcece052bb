"""DataParallel: equals local training on identical data and on the concatenated batch; failed rounds."""

from __future__ import annotations

import pytest
import torch
from strategy_helpers import (
    InProcessGroup,
    assert_plain,
    backward,
    batch,
    make_model,
    make_optimizer,
    make_strategy,
    params_of,
    run_threads,
)

from optimizers.data_parallel import flatten_buckets, unflatten_buckets
from swarmtrain.core.errors import ConfigError

STEPS = 5


def _local(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    model = make_model()
    opt = make_optimizer(model)
    strat = make_strategy("local", model, opt, None)
    for x, y in batches:
        backward(model, x, y)
        strat.step(len(x))
    return params_of(model)


def _data_parallel(n: int, same_data: bool, bucket_numel: int = 1 << 22) -> list[dict[str, torch.Tensor]]:
    group = InProcessGroup(n)

    def peer(i: int) -> dict[str, torch.Tensor]:
        model = make_model()
        opt = make_optimizer(model)
        strat = make_strategy("data_parallel", model, opt, group[i])
        strat.bucket_numel = bucket_numel  # type: ignore[attr-defined]
        for s in range(STEPS):
            x, y = batch(0 if same_data else i, s)
            backward(model, x, y)
            rep = strat.step(len(x))
            assert rep.synced and rep.committed and rep.participants == n
        return params_of(model)

    return run_threads(peer, n)


def test_identical_data_equals_local_bit_exact() -> None:
    ref = _local([batch(0, s) for s in range(STEPS)])
    for out in _data_parallel(4, same_data=True):
        for name in ref:
            assert torch.equal(out[name], ref[name]), name


def test_different_data_equals_local_on_concatenated_batch() -> None:
    n = 3
    concat = []
    for s in range(STEPS):
        xs, ys = zip(*(batch(i, s) for i in range(n)), strict=True)
        concat.append((torch.cat(xs), torch.cat(ys)))
    ref = _local(concat)
    outs = _data_parallel(n, same_data=False, bucket_numel=50)  # several buckets
    for out in outs:
        for name in ref:
            torch.testing.assert_close(out[name], ref[name], rtol=1e-5, atol=1e-6)
            assert torch.equal(out[name], outs[0][name])  # replicas identical


def test_failed_round_skips_the_step() -> None:
    group = InProcessGroup(2)
    group.fail_rounds({1})

    def peer(i: int) -> None:
        model = make_model()
        opt = make_optimizer(model)
        strat = make_strategy("data_parallel", model, opt, group[i])
        backward(model, *batch(i, 0))
        assert strat.step(16).committed
        before, opt_before = (
            params_of(model),
            {k: v["exp_avg"].clone() for k, v in enumerate(opt.state.values())},
        )
        backward(model, *batch(i, 1))
        rep = strat.step(16)
        assert rep.synced and not rep.committed
        after = params_of(model)
        assert all(torch.equal(before[k], after[k]) for k in before)
        assert all(torch.equal(opt_before[k], v["exp_avg"]) for k, v in enumerate(opt.state.values()))
        state = strat.state_dict()
        assert_plain(state)
        assert state["steps"] == 1 and state["failed_rounds"] == 1

    run_threads(peer, 2)


def test_buckets_round_trip_and_needs_collective() -> None:
    ts = [torch.randn(3, 4), torch.randn(7), torch.randn(2, 2, 2)]
    buckets, layout = flatten_buckets(ts, bucket_numel=10)
    assert sorted(buckets) == ["bucket0", "bucket1", "bucket2"]
    back = unflatten_buckets(buckets, layout, ts)
    assert all(torch.equal(a, b) for a, b in zip(ts, back, strict=True))
    model = make_model()
    with pytest.raises(ConfigError, match="needs a collective"):
        make_strategy("data_parallel", model, make_optimizer(model), None)
