"""DiLoCo: reduces to local training, keeps replicas identical, restores exactly, survives failed rounds."""

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
    make_strategy,
    params_of,
    run_threads,
)

from optimizers import DiLoCo, OuterSGD
from swarmtrain.core.errors import ConfigError


def test_outer_sgd_matches_torch_sgd() -> None:
    torch.manual_seed(1)
    p_ref = torch.randn(5, requires_grad=True)
    ref = torch.optim.SGD([p_ref], lr=0.7, momentum=0.9, nesterov=True)
    mine = {"p": p_ref.detach().clone()}
    outer = OuterSGD(0.7, 0.9, True)
    for _ in range(4):
        g = torch.randn(5)
        p_ref.grad = g.clone()
        ref.step()
        outer.step(mine, {"p": g})
        assert torch.equal(mine["p"], p_ref.detach())


def test_one_peer_outer_lr_one_no_momentum_equals_local() -> None:
    ref_model = make_model()
    ref_opt = make_optimizer(ref_model)
    model = make_model()
    opt = make_optimizer(model)
    strat = make_strategy(
        "diloco", model, opt, InProcessGroup(1)[0], inner_steps=3, outer_lr=1.0, outer_momentum=0.0
    )
    for s in range(10):
        backward(ref_model, *batch(0, s))
        ref_opt.step()
        backward(model, *batch(0, s))
        rep = strat.step(16)
        assert rep.synced == ((s + 1) % 3 == 0)
    for n, p in params_of(ref_model).items():
        torch.testing.assert_close(params_of(model)[n], p, rtol=0, atol=1e-6)


def test_peers_identical_after_every_outer_step() -> None:
    n, h = 3, 4
    group = InProcessGroup(n)
    seen: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(n)]

    def peer(i: int) -> None:
        model = make_model()
        strat = make_strategy("diloco", model, make_optimizer(model), group[i], inner_steps=h)
        for s in range(3 * h):
            backward(model, *batch(i, s))
            rep = strat.step(16 + i)
            if rep.synced:
                assert rep.committed and rep.participants == n and rep.bytes_sent > 0
                seen[i].append(params_of(model))

    run_threads(peer, n)
    assert len(seen[0]) == 3
    for k in range(3):
        for name, t in seen[0][k].items():
            assert all(torch.equal(seen[i][k][name], t) for i in range(1, n)), name
    assert not torch.equal(seen[0][0]["head.weight"], seen[0][1]["head.weight"])  # it trained


def _train(model: torch.nn.Module, strat: object, steps: range, peer: int = 0) -> None:
    for s in steps:
        backward(model, *batch(peer, s))
        strat.step(16)  # type: ignore[attr-defined]


def test_state_dict_round_trip_is_bit_exact() -> None:
    model = make_model()
    opt = make_optimizer(model)
    strat = make_strategy("diloco", model, opt, InProcessGroup(1)[0], inner_steps=4)
    _train(model, strat, range(6))  # mid-cycle: anchor != local, momentum set
    state = copy.deepcopy(strat.state_dict())
    assert_plain(state)
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())

    model2 = make_model(seed=99)
    model2.load_state_dict(saved_model)
    opt2 = make_optimizer(model2)
    opt2.load_state_dict(saved_opt)
    strat2 = make_strategy("diloco", model2, opt2, InProcessGroup(1)[0], inner_steps=4)
    strat2.load_state_dict(state)
    _train(model, strat, range(6, 15))
    _train(model2, strat2, range(6, 15))
    for n, p in params_of(model).items():
        assert torch.equal(params_of(model2)[n], p), n
    assert strat.state_dict()["outer_steps"] == strat2.state_dict()["outer_steps"] == 3


def test_failed_round_keeps_local_params_and_retries() -> None:
    group = InProcessGroup(1)
    group.fail_rounds({0})
    ref_model = make_model()
    ref_opt = make_optimizer(ref_model)
    model = make_model()
    strat = make_strategy("diloco", model, make_optimizer(model), group[0], inner_steps=2)
    assert isinstance(strat, DiLoCo)
    anchor0 = {k: v.clone() for k, v in strat.anchor.items()}
    for s in range(2):
        backward(ref_model, *batch(0, s))
        ref_opt.step()
        backward(model, *batch(0, s))
        rep = strat.step(16)
    assert rep.synced and not rep.committed
    for n, p in params_of(ref_model).items():  # exactly local training, anchor untouched
        assert torch.equal(params_of(model)[n], p)
        assert torch.equal(strat.anchor[n], anchor0[n])
    assert strat.tokens_since_sync == 32
    _train(model, strat, range(2, 4))
    assert strat.outer_steps == 1 and strat.failed_rounds == 1 and strat.tokens_since_sync == 0


def test_needs_collective_and_bad_state() -> None:
    model = make_model()
    with pytest.raises(ConfigError, match="needs a collective"):
        make_strategy("diloco", model, make_optimizer(model), None)
    strat = make_strategy("diloco", model, make_optimizer(model), InProcessGroup(1)[0])
    state = strat.state_dict()
    state["anchor"] = {"nope": torch.zeros(1)}
    with pytest.raises(ConfigError, match="anchor"):
        strat.load_state_dict(state)
