"""DeMo with a robust reducer (issue 6 point 2): the gathered DCT components go through the reducer.

``demo_reduce`` is checked against the obvious construction (one dense row per peer, zeros where it
sent nothing, the reducer over the whole rows); the strategy is checked over an in-process group in
which one contributor sends huge values: the default mean is wrecked, coordinate_median and
centered_clip are not, and every peer ends bit-identical.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from strategy_helpers import IdentityCompressor, InProcessGroup, run_threads

from optimizers import StrategyContext, build_strategy
from optimizers.demo import demo_aggregate, demo_extract, demo_reduce, is_robust
from peers.reducers import build_reducer
from swarmtrain.core.config import CompressionConfig, DeMoConfig
from swarmtrain.core.protocols import Reducer

SHAPES = {"w": (8, 12), "b": (16,)}
LR = 0.05


def _contributions(
    n: int, n_chunks: int, chunk_numel: int, k: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [demo_extract(torch.randn(n_chunks, chunk_numel, generator=g), k) for _ in range(n)]


def _dense_reference(
    contributions: list[tuple[torch.Tensor, torch.Tensor]], n_chunks: int, chunk_numel: int, reducer: Reducer
) -> torch.Tensor:
    rows = torch.zeros(len(contributions), n_chunks * chunk_numel)
    for i, (idx, val) in enumerate(contributions):
        for c in range(n_chunks):
            for j in range(idx.shape[1]):
                rows[i, c * chunk_numel + int(idx[c, j])] = float(val[c, j])
    return reducer.reduce(rows, torch.ones(len(contributions))).view(n_chunks, chunk_numel)


@pytest.mark.parametrize(
    "name", ["coordinate_median", "trimmed_mean", "centered_clip", "krum", "multi_krum", "geometric_median"]
)
def test_demo_reduce_equals_the_reducer_over_dense_rows(name: str) -> None:
    n_chunks, chunk_numel, k = 4, 16, 5
    contribs = _contributions(7, n_chunks, chunk_numel, k, seed=3)
    reducer = build_reducer(name, 1)
    got = demo_reduce(contribs, n_chunks, chunk_numel, reducer)
    want = _dense_reference(contribs, n_chunks, chunk_numel, reducer)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # positions nobody sent stay exactly 0
    sent = torch.zeros(n_chunks, chunk_numel, dtype=torch.bool)
    for idx, _ in contribs:
        sent.scatter_(1, idx, True)
    assert bool((got[~sent] == 0).all())
    assert torch.equal(got, demo_reduce(contribs, n_chunks, chunk_numel, reducer))  # deterministic


def test_is_robust() -> None:
    assert not is_robust(None)
    assert not is_robust(build_reducer("mean"))
    assert is_robust(build_reducer("centered_clip", 1))


class Params(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(11)
        for n, s in SHAPES.items():
            self.register_parameter(n, torch.nn.Parameter(torch.randn(s, generator=g)))


def _grads(peer: int, step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + peer)
    # a shared signal plus per-peer noise, so honest peers agree on the direction
    base = torch.Generator().manual_seed(step)
    return {n: torch.randn(s, generator=base) + 0.3 * torch.randn(s, generator=g) for n, s in SHAPES.items()}


def _run(
    n: int,
    reducer: tuple[str, int] | None,
    *,
    huge: int | None = None,
    steps: int = 2,
    sign: bool = False,
) -> tuple[list[dict[str, torch.Tensor]], list[Any]]:
    """``n`` DeMo peers for ``steps`` steps; peer ``huge`` (if any) sends components scaled by 1e6."""
    group = InProcessGroup(n)
    p0 = {k: v.detach().clone() for k, v in Params().named_parameters()}

    def peer(i: int) -> tuple[dict[str, torch.Tensor], Any]:
        model = Params()
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        cfg = DeMoConfig(demo_chunk=4, demo_topk=3, demo_decay=0.9, demo_sign=sign)
        red = build_reducer(*reducer) if reducer is not None else None
        strat = build_strategy(
            StrategyContext(model, opt, cfg, CompressionConfig(), group[i], red, IdentityCompressor())
        )
        for s in range(steps):
            for name, p in model.named_parameters():
                g = _grads(i, s)[name]
                p.grad = g * 1e6 if i == huge else g
            strat.step(1)
        return {k: v.detach().clone() for k, v in model.named_parameters()}, strat

    outs = run_threads(peer, n)
    moved = [{k: out[k] - p0[k] for k in out} for out, _ in outs]
    return moved, [s for _, s in outs]


def _norm(d: dict[str, torch.Tensor]) -> float:
    return float(torch.cat([t.reshape(-1) for t in d.values()]).norm())


def _dist(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return _norm({k: a[k] - b[k] for k in a})


def _identical(moved: list[dict[str, torch.Tensor]]) -> bool:
    return all(torch.equal(m[k], moved[0][k]) for m in moved for k in m)


@pytest.mark.parametrize("name", ["coordinate_median", "centered_clip"])
def test_one_huge_contributor_wrecks_the_mean_but_not_a_robust_reducer(name: str) -> None:
    n = 5
    clean, _ = _run(n, None)
    mean, _ = _run(n, None, huge=0)
    robust, strats = _run(n, (name, 1), huge=0)
    robust_clean, _ = _run(n, (name, 1))
    assert _identical(clean) and _identical(mean) and _identical(robust) and _identical(robust_clean)
    scale = _norm(clean[1])
    assert scale > 0
    # the attacker's components dominate the mean: the step is orders of magnitude too long
    assert _dist(mean[1], clean[1]) > 1e3 * scale
    # the robust reducer's step stays near what the same reducer does without the attacker
    assert _dist(robust[1], robust_clean[1]) < 0.5 * scale
    assert _norm(robust[1]) < 2 * scale
    assert all(s.failed_rounds == 0 for s in strats)


def test_mean_reducer_keeps_the_default_path_bit_for_bit() -> None:
    for sign in (False, True):
        default, _ = _run(3, None, steps=3, sign=sign)
        mean, _ = _run(3, ("mean", 0), steps=3, sign=sign)
        for a, b in zip(default, mean, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in a)


def test_default_path_is_the_per_position_mean_over_senders() -> None:
    contribs = _contributions(3, 2, 8, 3, seed=5)
    got = demo_aggregate(contribs, 2, 8)
    total, count = torch.zeros(2, 8), torch.zeros(2, 8)
    for idx, val in contribs:
        for c in range(2):
            for j in range(3):
                total[c, int(idx[c, j])] += float(val[c, j])
                count[c, int(idx[c, j])] += 1
    torch.testing.assert_close(got, total / count.clamp(min=1), rtol=0, atol=1e-6)


def test_a_refusing_reducer_leaves_the_step_undone() -> None:
    # coordinate_median with f=1 needs 3 rows; two peers cannot satisfy it
    moved, strats = _run(2, ("coordinate_median", 1), steps=1)
    for m, s in zip(moved, strats, strict=True):
        assert _norm(m) == 0.0
        assert s.failed_rounds == 1 and s.steps == 0
        for name, g in _grads(strats.index(s), 0).items():
            torch.testing.assert_close(s.delta[name], LR * g)  # nothing was removed from the momentum
