"""DiLoCo and StreamingDiLoCo through the real codecs (build_compressor) with error feedback."""

from __future__ import annotations

import copy

import pytest
import torch
from strategy_helpers import (
    InProcessGroup,
    assert_plain,
    backward,
    batch,
    make_model,
    make_optimizer,
    run_threads,
)

from optimizers import StrategyContext, build_strategy
from swarmtrain.core.config import CompressionConfig, DiLoCoConfig, strategy_config
from swarmtrain.core.protocols import Collective, Strategy


def _build(
    name: str, model: torch.nn.Module, coll: Collective, codec: str, ef: str, **opts: object
) -> Strategy:
    ctx = StrategyContext(
        model=model,
        optimizer=make_optimizer(model),
        config=strategy_config(name, **opts),
        compression=CompressionConfig(codec=codec, error_feedback=ef),  # type: ignore[arg-type]
        collective=coll,
    )
    return build_strategy(ctx)


@pytest.mark.parametrize(
    ("name", "codec", "opts"),
    [
        ("diloco", "int8", {"inner_steps": 3}),
        ("streaming_diloco", "int4", {"inner_steps": 4, "fragments": 2, "overlap": 1, "mixing": 0.0}),
        ("streaming_diloco", "ternary", {"inner_steps": 4, "fragments": 2, "overlap": 0, "mixing": 0.0}),
    ],
)
def test_replicas_identical_after_sync_with_codec_and_ef(
    name: str, codec: str, opts: dict[str, object]
) -> None:
    group = InProcessGroup(2)
    seen: list[list[dict[str, torch.Tensor]]] = [[], []]

    def peer(i: int) -> None:
        model = make_model()
        strat = _build(name, model, group[i], codec, "ef", **opts)
        for s in range(9):
            backward(model, *batch(i, s))
            rep = strat.step(16)
            if rep.synced:
                assert rep.committed
                names = strat.fragments[int(rep.extra["fragment"])] if "fragment" in rep.extra else None  # type: ignore[attr-defined]
                seen[i].append(
                    {
                        k: v.detach().clone()
                        for k, v in model.named_parameters()
                        if names is None or k in names
                    }
                )
        strat.close()
        assert strat.state_dict()["compressor"], "error feedback keeps residuals"

    run_threads(peer, 2)
    assert len(seen[0]) >= 2
    for a, b in zip(seen[0], seen[1], strict=True):  # what was just synced is identical (alpha = 0)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_error_feedback_state_round_trip_is_bit_exact() -> None:
    model = make_model()
    strat = _build("diloco", model, InProcessGroup(1)[0], "int8", "ef", inner_steps=2)
    opt = strat.ctx.optimizer  # type: ignore[attr-defined]
    for s in range(5):
        backward(model, *batch(0, s))
        strat.step(16)
    state = copy.deepcopy(strat.state_dict())
    assert_plain(state)
    assert state["compressor"]
    model2 = make_model(seed=3)
    model2.load_state_dict(copy.deepcopy(model.state_dict()))
    strat2 = _build("diloco", model2, InProcessGroup(1)[0], "int8", "ef", inner_steps=2)
    strat2.ctx.optimizer.load_state_dict(copy.deepcopy(opt.state_dict()))  # type: ignore[attr-defined]
    strat2.load_state_dict(state)
    for m, st in ((model, strat), (model2, strat2)):
        for s in range(5, 11):
            backward(m, *batch(0, s))
            st.step(16)
    for (n, a), (_, b) in zip(model.named_parameters(), model2.named_parameters(), strict=True):
        assert torch.equal(a, b), n


def test_ef21_is_refused_by_strategies_with_a_clear_error() -> None:
    from optimizers.base import make_compressor
    from swarmtrain.core.errors import ConfigError

    model = torch.nn.Linear(2, 2)
    ctx = StrategyContext(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        config=DiLoCoConfig(),
        compression=CompressionConfig(codec="int8", error_feedback="ef21"),
    )
    with pytest.raises(ConfigError, match="ef21"):
        make_compressor(ctx)
