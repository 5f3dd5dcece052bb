"""Issue 16, defect 1: a round that does not commit must not advance the error-feedback residual.

DiLoCo with top-k 1 % + EF through the in-process collective, outer lr 1 and no momentum, so the anchor
moves by exactly what the rounds applied. Error feedback promises ``applied + residual == true progress``
(the sum of the pseudo-gradients of the committed rounds, each covering every step since the last good
sync). A failed round that still advanced the residual counts its pseudo-gradient twice: once in the
residual and once in the next round's pseudo-gradient (which covers those steps again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from compression import ErrorFeedback, TopKCompressor
from optimizers import InProcessGroup, StrategyContext, build_strategy
from optimizers.base import reduce_or_rollback
from swarmtrain.core.config import CompressionConfig, strategy_config
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import Collective, Compressor, Reducer, RoundResult


class _Spy:
    """A collective that records what each round was given and what it returned."""

    def __init__(self, inner: Collective) -> None:
        self.inner = inner
        self.rounds: list[tuple[dict[str, torch.Tensor], RoundResult]] = []

    def all_reduce(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        compressor: Compressor,
        reducer: Reducer | None = None,
        weight: float = 1.0,
        timeout: float = 60.0,
        kind: str = "reduce",
    ) -> RoundResult:
        res = self.inner.all_reduce(
            tensors, compressor=compressor, reducer=reducer, weight=weight, timeout=timeout, kind=kind
        )
        self.rounds.append(({n: t.detach().clone() for n, t in tensors.items()}, res))
        return res

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _gap_after(rounds: int, failed: set[int]) -> float:
    """``|applied + residual - true progress|`` over ``rounds`` DiLoCo rounds, in units of the norm of
    the first failed round's pseudo-gradient (or of the first round's when none fails)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    group = InProcessGroup(1)
    group.fail_rounds(failed)
    spy = _Spy(group[0])
    ctx = StrategyContext(
        model=model,
        optimizer=opt,
        config=strategy_config("diloco", inner_steps=2, outer_lr=1.0, outer_momentum=0.0, nesterov=False),
        compression=CompressionConfig(codec="topk", topk_fraction=0.01, error_feedback="ef"),
        collective=spy,  # type: ignore[arg-type]
    )
    strat = build_strategy(ctx)
    ef = strat.compressor  # type: ignore[attr-defined]
    assert isinstance(ef, ErrorFeedback)
    anchor0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(1)
    for _ in range(2 * rounds):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g) * 1e-2
        strat.step(16)
    assert len(spy.rounds) == rounds
    gap = 0.0
    unit_round = min(failed) if failed else 0
    unit = sum(float(t.norm() ** 2) for t in spy.rounds[unit_round][0].values()) ** 0.5
    for n in anchor0:
        true = sum(sent[n] for sent, res in spy.rounds if res.committed)
        applied = anchor0[n] - strat.anchor[n]  # type: ignore[attr-defined]
        residual = ef.residual(n)
        assert residual is not None
        gap += float((applied.double() + residual - true.double()).norm() ** 2)
    return gap**0.5 / unit


def test_ef_invariant_holds_without_failures() -> None:
    assert _gap_after(6, set()) < 1e-5


def test_failed_round_leaves_error_feedback_residual_untouched() -> None:
    # Before the fix: 1.009 (the failed round's pseudo-gradient less its top 1 % was counted twice).
    assert _gap_after(6, {2}) < 1e-5


def test_rollback_restores_residuals_and_forgets_new_keys() -> None:
    ef = ErrorFeedback(TopKCompressor(fraction=0.1))
    x = torch.randn(100, generator=torch.Generator().manual_seed(3))
    ef.compress(x, key="a")
    before = ef.residual("a")
    assert before is not None
    before = before.clone()

    def fail(*args: Any, **kwargs: Any) -> RoundResult:
        ef.compress(2 * x, key="a")
        ef.compress(x, key="b")
        return RoundResult(0, (), 0, 0, False, reason="injected")

    class _Coll:
        all_reduce = staticmethod(fail)

    res = reduce_or_rollback(_Coll(), {"a": x}, compressor=ef, weight=1.0, timeout=1.0)  # type: ignore[arg-type]
    assert not res.committed
    assert torch.equal(ef.residual("a"), before)  # type: ignore[arg-type]
    assert ef.residual("b") is None

    def boom(*args: Any, **kwargs: Any) -> RoundResult:
        ef.compress(x, key="c")
        raise TimeoutError("network")

    _Coll.all_reduce = staticmethod(boom)
    with pytest.raises(TimeoutError):
        reduce_or_rollback(_Coll(), {"a": x}, compressor=ef, weight=1.0, timeout=1.0)  # type: ignore[arg-type]
    assert ef.residual("c") is None
    ef.begin_round()
    with pytest.raises(ConfigError, match="already open"):
        ef.begin_round()
    ef.commit_round()
