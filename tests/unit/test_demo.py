"""DeMo vs a direct float64 implementation of the paper's equations (golden fixture), and over peers.

The reference below is written independently of ``optimizers.demo``: explicit DCT-II basis built from
the cosine formula, python loops over every chunk, top-k by sorting, and a per-coefficient mean over
the peers that sent it. ``tests/fixtures/demo_golden.json`` holds its inputs and outputs; regenerate it
with ``python tests/unit/test_demo.py``.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import torch
from strategy_helpers import (
    IdentityCompressor,
    InProcessGroup,
    assert_plain,
    backward,
    batch,
    make_model,
    run_threads,
)

from optimizers import StrategyContext, build_strategy
from optimizers.dct import ChunkedDCT
from swarmtrain.core.config import CompressionConfig, DeMoConfig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "demo_golden.json"
SHAPES = {"w": (6, 8), "b": (10,), "c": (2, 3, 4)}
HYPER = {"chunk": 4, "topk": 3, "decay": 0.9, "lr": 0.05, "wd": 0.1}


# ----------------------------------------------------------------- the reference, in float64 loops
def ref_basis(n: int) -> list[list[float]]:
    return [
        [
            (math.sqrt(1 / n) if k == 0 else math.sqrt(2 / n)) * math.cos(math.pi * (2 * i + 1) * k / (2 * n))
            for i in range(n)
        ]
        for k in range(n)
    ]


def ref_divisor(size: int, target: int) -> int:
    return max(d for d in range(1, min(size, target) + 1) if size % d == 0)


def ref_tiles(shape: tuple[int, ...], chunk: int) -> tuple[int, int, int, int]:
    rows = shape[0] if len(shape) > 1 else 1
    cols = math.prod(shape) // rows
    h = ref_divisor(rows, chunk) if len(shape) > 1 else 1
    w = ref_divisor(cols, chunk)
    return rows, cols, h, w


def ref_step(
    params: dict[str, torch.Tensor],
    moms: list[dict[str, torch.Tensor]],
    grads: list[dict[str, torch.Tensor]],
    sign: bool,
) -> dict[str, torch.Tensor]:
    """One DeMo step for every peer: updates ``moms`` in place, returns the new (shared) params."""
    new: dict[str, torch.Tensor] = {}
    for name, p in params.items():
        rows, cols, h, w = ref_tiles(tuple(p.shape), HYPER["chunk"])
        bh, bw = (
            torch.tensor(ref_basis(h), dtype=torch.float64),
            torch.tensor(ref_basis(w), dtype=torch.float64),
        )
        k = min(HYPER["topk"], h * w)
        sums: dict[tuple[int, int, int], float] = {}
        counts: dict[tuple[int, int, int], int] = {}
        for mom, grad in zip(moms, grads, strict=True):
            m = mom[name].reshape(rows, cols)
            m.mul_(HYPER["decay"]).add_(HYPER["lr"] * grad[name].reshape(rows, cols).double())
            for r in range(0, rows, h):
                for c in range(0, cols, w):
                    coef = bh @ m[r : r + h, c : c + w] @ bw.T
                    flat = coef.reshape(-1).tolist()
                    picks = sorted(range(h * w), key=lambda j: -abs(flat[j]))[:k]
                    q = torch.zeros(h * w, dtype=torch.float64)
                    for j in picks:
                        q[j] = flat[j]
                        sums[(r, c, j)] = sums.get((r, c, j), 0.0) + flat[j]
                        counts[(r, c, j)] = counts.get((r, c, j), 0) + 1
                    m[r : r + h, c : c + w] -= bh.T @ q.reshape(h, w) @ bw
        upd = torch.zeros(rows, cols, dtype=torch.float64)
        for r in range(0, rows, h):
            for c in range(0, cols, w):
                q = torch.zeros(h * w, dtype=torch.float64)
                for j in range(h * w):
                    if (r, c, j) in counts:
                        q[j] = sums[(r, c, j)] / counts[(r, c, j)]
                upd[r : r + h, c : c + w] = bh.T @ q.reshape(h, w) @ bw
        if sign:
            upd = torch.sign(upd)
        new[name] = p * (1 - HYPER["lr"] * HYPER["wd"]) - HYPER["lr"] * upd.reshape(p.shape)
    return new


def golden_case(n_peers: int = 2, steps: int = 3) -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    p0 = {n: torch.randn(s, generator=g, dtype=torch.float64) for n, s in SHAPES.items()}
    grads = [
        [
            {n: torch.randn(s, generator=g, dtype=torch.float64) for n, s in SHAPES.items()}
            for _ in range(n_peers)
        ]
        for _ in range(steps)
    ]
    params = {n: t.float().double() for n, t in p0.items()}
    moms = [{n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()} for _ in range(n_peers)]
    expected = []
    for step in grads:
        params = ref_step(
            params, moms, [{n: t.float().double() for n, t in gr.items()} for gr in step], False
        )
        expected.append({n: t.tolist() for n, t in params.items()})
    return {
        "hyper": HYPER,
        "params": {n: t.float().tolist() for n, t in p0.items()},
        "grads": [[{n: t.float().tolist() for n, t in gr.items()} for gr in step] for step in grads],
        "expected": expected,
    }


# ----------------------------------------------------------------- the strategy under test
class Params(torch.nn.Module):
    def __init__(self, init: dict[str, Any]) -> None:
        super().__init__()
        for n in SHAPES:
            self.register_parameter(n, torch.nn.Parameter(torch.tensor(init[n], dtype=torch.float32)))


def _demo(model: torch.nn.Module, coll: Any, sign: bool, values: str = "fp32") -> Any:
    opt = torch.optim.SGD(model.parameters(), lr=HYPER["lr"], weight_decay=HYPER["wd"])
    cfg = DeMoConfig(
        demo_chunk=HYPER["chunk"],
        demo_topk=HYPER["topk"],
        demo_decay=HYPER["decay"],
        demo_sign=sign,
        demo_values=values,
    )
    return build_strategy(
        StrategyContext(model, opt, cfg, CompressionConfig(), coll, None, IdentityCompressor())
    )


def _run_case(case: dict[str, Any], sign: bool) -> list[list[dict[str, torch.Tensor]]]:
    n = len(case["grads"][0])
    group = InProcessGroup(n)

    def peer(i: int) -> list[dict[str, torch.Tensor]]:
        model = Params(case["params"])
        strat = _demo(model, group[i], sign)
        out = []
        for step in case["grads"]:
            for name, p in model.named_parameters():
                p.grad = torch.tensor(step[i][name], dtype=torch.float32)
            rep = strat.step(1)
            assert rep.committed and rep.participants == n
            out.append({k: v.detach().clone() for k, v in model.named_parameters()})
        return out

    return run_threads(peer, n)


def test_chunked_dct_matches_reference_basis_and_inverts() -> None:
    x = torch.randn(6, 8, dtype=torch.float64)
    t = ChunkedDCT((6, 8), 4)
    assert (t.h, t.w, t.n_chunks) == (3, 4, 4)
    bh, bw = torch.tensor(ref_basis(3), dtype=torch.float64), torch.tensor(ref_basis(4), dtype=torch.float64)
    first_tile = (bh @ x[:3, :4] @ bw.T).reshape(-1)
    torch.testing.assert_close(t.encode(x)[0], first_tile)
    torch.testing.assert_close(t.decode(t.encode(x)), x)
    v = torch.randn(2, 3, 4)
    torch.testing.assert_close(ChunkedDCT((2, 3, 4), 4).decode(ChunkedDCT((2, 3, 4), 4).encode(v)), v)


def test_reference_reproduces_the_golden_fixture() -> None:
    stored = json.loads(FIXTURE.read_text())
    fresh = golden_case()
    assert stored["hyper"] == fresh["hyper"] and stored["grads"] == fresh["grads"]
    for a, b in zip(stored["expected"], fresh["expected"], strict=True):
        for n in a:
            torch.testing.assert_close(torch.tensor(a[n]), torch.tensor(b[n]), rtol=0, atol=1e-12)


def test_demo_matches_golden_fixture_on_two_peers() -> None:
    case = json.loads(FIXTURE.read_text())
    outs = _run_case(case, sign=False)
    for step, expected in enumerate(case["expected"]):
        for n, val in expected.items():
            want = torch.tensor(val, dtype=torch.float32)
            torch.testing.assert_close(outs[0][step][n], want, rtol=0, atol=2e-6, msg=f"{n} step {step}")
            assert torch.equal(outs[0][step][n], outs[1][step][n])


def test_demo_sign_step_matches_reference() -> None:
    case = golden_case(n_peers=3, steps=2)
    outs = _run_case(case, sign=True)
    params = {n: torch.tensor(v, dtype=torch.float64) for n, v in case["params"].items()}
    moms = [{n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()} for _ in range(3)]
    for step, grads in enumerate(case["grads"]):
        params = ref_step(
            params,
            moms,
            [{n: torch.tensor(t, dtype=torch.float64) for n, t in g.items()} for g in grads],
            True,
        )
        for n, want in params.items():
            torch.testing.assert_close(outs[0][step][n].double(), want, rtol=0, atol=1e-6)
            assert all(torch.equal(outs[0][step][n], outs[i][step][n]) for i in (1, 2))


def test_demo_trains_a_model_with_identical_replicas() -> None:
    group = InProcessGroup(2)

    def peer(i: int) -> tuple[float, float, dict[str, torch.Tensor]]:
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=3e-3)
        cfg = DeMoConfig(demo_chunk=8, demo_topk=4, demo_values="fp16")
        strat = build_strategy(
            StrategyContext(model, opt, cfg, CompressionConfig(), group[i], None, IdentityCompressor())
        )
        losses = []
        for s in range(40):
            losses.append(backward(model, *batch(i, s % 4)))
            rep = strat.step(16)
        assert rep.bytes_sent > 0
        return sum(losses[:4]) / 4, sum(losses[-4:]) / 4, {k: v.detach() for k, v in model.named_parameters()}

    (a0, a1, pa), (b0, b1, pb) = run_threads(peer, 2)
    assert a1 < 0.8 * a0 and b1 < 0.8 * b0
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


if __name__ == "__main__":
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(golden_case()))
    print(f"wrote {FIXTURE}")


def _tiny_demo(coll: Any, seed: int = 0) -> tuple[torch.nn.Module, Any]:
    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=3e-3, weight_decay=0.01)
    cfg = DeMoConfig(demo_chunk=8, demo_topk=3, demo_values="bf16")
    return model, build_strategy(
        StrategyContext(model, opt, cfg, CompressionConfig(), coll, None, IdentityCompressor())
    )


def test_state_dict_round_trip_is_bit_exact() -> None:
    model, strat = _tiny_demo(InProcessGroup(1)[0])
    for s in range(3):
        backward(model, *batch(0, s))
        strat.step(16)
    state = copy.deepcopy(strat.state_dict())
    assert_plain(state)
    model2, strat2 = _tiny_demo(InProcessGroup(1)[0], seed=5)
    model2.load_state_dict(copy.deepcopy(model.state_dict()))
    strat2.load_state_dict(state)
    for m, st in ((model, strat), (model2, strat2)):
        for s in range(3, 7):
            backward(m, *batch(0, s))
            st.step(16)
    for (n, a), (_, b) in zip(model.named_parameters(), model2.named_parameters(), strict=True):
        assert torch.equal(a, b), n


def test_failed_gather_changes_no_parameter_and_keeps_the_gradient() -> None:
    group = InProcessGroup(1)
    group.fail_rounds({0})
    model, strat = _tiny_demo(group[0])
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    backward(model, *batch(0, 0))
    grads = {k: v.grad.clone() for k, v in model.named_parameters() if v.grad is not None}
    rep = strat.step(16)
    assert rep.synced and not rep.committed
    for k, v in model.named_parameters():
        assert torch.equal(v.detach(), before[k])
        torch.testing.assert_close(strat.delta[k], 3e-3 * grads[k])  # momentum = lr * g, nothing removed
    backward(model, *batch(0, 1))
    assert strat.step(16).committed and strat.failed_rounds == 1


def test_learning_rate_is_read_from_the_groups_a_loaded_optimizer_state_put_in_place() -> None:
    """``optimizer.load_state_dict`` (a resume, a peer's state adopted) replaces the param-group
    dicts; DeMo must step with the learning rate the trainer sets on the new ones. With the groups
    cached at construction, a restarted peer stepped with a stale lr and its parameters left the
    swarm's after its first round (the chaos run's DeMo failure)."""
    model, strat = _tiny_demo(InProcessGroup(1)[0])
    opt = strat.ctx.optimizer
    opt.load_state_dict(opt.state_dict())  # new group dicts, as a resume or a download does
    for group in opt.param_groups:
        group["lr"], group["weight_decay"] = 0.0, 0.0  # what the trainer's schedule would set
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    backward(model, *batch(0, 0))
    assert strat.step(16).committed
    for k, v in model.named_parameters():
        assert torch.equal(v.detach(), before[k]), k  # lr 0: no parameter moves
