"""Reducers vs direct, obviously-correct float64 implementations of each paper's formula.

The references loop over coordinates / rows / pairs in plain Python and numpy; the reducers under
test are vectorised torch. Seeded random inputs of several shapes and scales.
"""

from __future__ import annotations

import itertools
import statistics

import numpy as np
import pytest
import torch

from peers.reducers import (
    REDUCERS,
    CenteredClip,
    GeometricMedian,
    build_reducer,
)

SHAPES = [(5, 1), (7, 13), (8, 40), (11, 64), (16, 33)]


def _inputs(n: int, m: int, seed: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** (seed % 5 - 2)
    return (torch.randn(n, m, generator=g, dtype=torch.float64) * scale + scale).to(dtype)


# ---- references (deliberately naive) ---------------------------------------------------------------


def ref_mean(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return sum(w[i] * x[i] for i in range(len(x))) / w.sum()


def ref_median(x: np.ndarray) -> np.ndarray:
    return np.array([statistics.median(x[:, j].tolist()) for j in range(x.shape[1])])


def ref_trimmed(x: np.ndarray, b: int) -> np.ndarray:
    out = []
    for j in range(x.shape[1]):
        col = sorted(x[:, j].tolist())
        kept = col[b : len(col) - b]
        out.append(sum(kept) / len(kept))
    return np.array(out)


def ref_krum_scores(x: np.ndarray, f: int) -> list[float]:
    n = len(x)
    scores = []
    for i in range(n):
        d = sorted(float(((x[i] - x[j]) ** 2).sum()) for j in range(n) if j != i)
        scores.append(sum(d[: n - f - 2]))
    return scores


def ref_krum(x: np.ndarray, f: int) -> np.ndarray:
    s = ref_krum_scores(x, f)
    return x[min(range(len(x)), key=lambda i: (s[i], i))]


def ref_multi_krum(x: np.ndarray, f: int, k: int) -> np.ndarray:
    s = ref_krum_scores(x, f)
    best = sorted(range(len(x)), key=lambda i: (s[i], i))[:k]
    return sum(x[i] for i in best) / k


def ref_centered_clip(x: np.ndarray, tau: float, iters: int, tol: float, v0: np.ndarray) -> np.ndarray:
    v = v0.copy()
    n = len(x)
    for _ in range(iters):
        step = np.zeros_like(v)
        for i in range(n):
            diff = x[i] - v
            norm = float(np.sqrt((diff**2).sum()))
            step += diff * (1.0 if norm <= tau else tau / norm)
        step /= n
        v = v + step
        if np.sqrt((step**2).sum()) <= tol * tau:
            break
    return v


def geo_objective(x: np.ndarray, z: np.ndarray) -> float:
    return float(sum(np.sqrt(((xi - z) ** 2).sum()) for xi in x))


# ---- agreement with the references -----------------------------------------------------------------


@pytest.mark.parametrize(("n", "m"), SHAPES)
@pytest.mark.parametrize("seed", range(3))
def test_mean_median_trimmed_match_reference(n: int, m: int, seed: int) -> None:
    x = _inputs(n, m, seed)
    w = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1
    xn, wn = x.numpy(), w.numpy()
    np.testing.assert_allclose(build_reducer("mean").reduce(x, w).numpy(), ref_mean(xn, wn), rtol=1e-12)
    f = (n - 1) // 2
    np.testing.assert_allclose(build_reducer("coordinate_median", f).reduce(x, w).numpy(), ref_median(xn))
    for b in range(f + 1):
        got = build_reducer("trimmed_mean", b).reduce(x, w).numpy()
        np.testing.assert_allclose(got, ref_trimmed(xn, b), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize(("n", "m"), [s for s in SHAPES if s[0] >= 5])
@pytest.mark.parametrize("seed", range(3))
def test_krum_and_multi_krum_match_reference(n: int, m: int, seed: int) -> None:
    x = _inputs(n, m, seed)
    w = torch.ones(n, dtype=torch.float64)
    for f in range((n - 3) // 2 + 1):
        assert torch.equal(build_reducer("krum", f).reduce(x, w), torch.from_numpy(ref_krum(x.numpy(), f)))
        for k in (1, n - f):
            got = build_reducer("multi_krum", f, select=k).reduce(x, w).numpy()
            np.testing.assert_allclose(got, ref_multi_krum(x.numpy(), f, k), rtol=1e-12)


@pytest.mark.parametrize(("n", "m"), SHAPES)
@pytest.mark.parametrize("seed", range(3))
def test_centered_clip_matches_reference(n: int, m: int, seed: int) -> None:
    x = _inputs(n, m, seed)
    xn = x.numpy()
    f = (n - 1) // 2
    w = torch.ones(n, dtype=torch.float64)
    v0 = ref_median(xn)
    # Fixed radius, from the median start.
    tau = float(np.median(np.sqrt(((xn - v0) ** 2).sum(1)))) * 0.5 + 1e-30
    got = CenteredClip(f, tau=tau, max_iters=20, tol=1e-7).reduce(x, w).numpy()
    np.testing.assert_allclose(got, ref_centered_clip(xn, tau, 20, 1e-7, v0), rtol=1e-10, atol=1e-12 * tau)
    # Adaptive radius: the lower median of the distances to the start.
    dists = sorted(np.sqrt(((xn - v0) ** 2).sum(1)).tolist())
    tau_auto = dists[(n - 1) // 2]
    got = CenteredClip(f).reduce(x, w).numpy()
    np.testing.assert_allclose(got, ref_centered_clip(xn, tau_auto, 20, 1e-5, v0), rtol=1e-10, atol=1e-12)
    # A passed-in reference replaces the median as the start point.
    start = xn.mean(0) + 0.1
    got = CenteredClip(f, tau=tau, max_iters=3, tol=0.0).reduce(x, w, reference=torch.from_numpy(start))
    np.testing.assert_allclose(got.numpy(), ref_centered_clip(xn, tau, 3, 0.0, start), rtol=1e-10, atol=1e-12)


def test_centered_clip_with_huge_tau_is_the_mean() -> None:
    x = _inputs(9, 20, 1)
    got = CenteredClip(2, tau=1e12, max_iters=20).reduce(x, torch.ones(9, dtype=torch.float64))
    torch.testing.assert_close(got, x.mean(0))


def test_centered_clip_iteration_cap() -> None:
    x = _inputs(9, 50, 2)
    r = CenteredClip(4, tau=1e-6, max_iters=20, tol=0.0)
    r.reduce(x, torch.ones(9, dtype=torch.float64))
    assert r.last_iters == 20


@pytest.mark.parametrize(("n", "m"), SHAPES)
@pytest.mark.parametrize("seed", range(3))
def test_geometric_median_is_the_minimiser(n: int, m: int, seed: int) -> None:
    x = _inputs(n, m, seed)
    xn = x.numpy()
    r = GeometricMedian((n - 1) // 2, max_iters=1000, tol=1e-10)
    z = r.reduce(x, torch.ones(n, dtype=torch.float64)).numpy()
    best = geo_objective(xn, z)
    # No better point nearby (random perturbations) and none among obvious candidates.
    g = np.random.default_rng(seed)
    scale = float(np.abs(xn).mean()) + 1e-300
    for _ in range(50):
        assert geo_objective(xn, z + g.normal(size=m) * 1e-4 * scale) >= best * (1 - 1e-9)
    for cand in (xn.mean(0), ref_median(xn), *xn):
        assert best <= geo_objective(xn, cand) * (1 + 1e-9)


def test_geometric_median_of_collinear_points_is_their_median() -> None:
    pts = [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0], [10.0, 10.0], [1000.0, 1000.0]]
    x = torch.tensor(pts, dtype=torch.float64)
    z = build_reducer("geometric_median", 2).reduce(x, torch.ones(5, dtype=torch.float64))
    torch.testing.assert_close(z, torch.tensor([2.0, 2.0], dtype=torch.float64), atol=1e-5, rtol=0)


# ---- breakdown behaviour ---------------------------------------------------------------------------

ROBUST = [
    ("coordinate_median", {}),
    ("trimmed_mean", {}),
    ("centered_clip", {}),
    ("krum", {}),
    ("multi_krum", {}),
    ("geometric_median", {}),
]


@pytest.mark.parametrize(("name", "opts"), ROBUST)
@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.parametrize("value", [1e6, -1e6])
def test_robust_reducers_stay_bounded_with_f_huge_rows(
    name: str, opts: dict[str, float], n: int, value: float
) -> None:
    r = build_reducer(name, 0, **opts)
    f = max(f for f in range(n) if n >= r.min_peers(f))
    r = build_reducer(name, f, **opts)
    g = torch.Generator().manual_seed(n)
    honest = torch.randn(n - f, 64, generator=g) * 0.1 + 1.0  # every honest value in ~[0.5, 1.5]
    for attackers in (torch.full((f, 64), value), torch.randn(f, 64, generator=g) * value):
        stack = torch.cat([attackers, honest])  # attackers first: no advantage from position
        out = r.reduce(stack, torch.ones(n))
        assert out.abs().max() < 3.0, f"{name} broken by {f}/{n} rows of {value}"
        mean = build_reducer("mean").reduce(stack, torch.ones(n))
        assert mean.abs().max() > 1e3  # the mean is not robust: same input, no bound


@pytest.mark.parametrize(("name", "opts"), ROBUST)
def test_median_family_ignores_rows_set_to_extremes(name: str, opts: dict[str, float]) -> None:
    # Moving f rows anywhere leaves coordinate median / trimmed mean inside the honest range.
    g = torch.Generator().manual_seed(3)
    honest = torch.randn(6, 30, generator=g)
    r = build_reducer(name, 2, **opts) if name not in ("krum", "multi_krum") else build_reducer(name, 1)
    f = r.n_byzantine
    for bad in (1e6, -1e6, 1e30):
        out = r.reduce(torch.cat([honest, torch.full((f, 30), bad)]), torch.ones(6 + f))
        lo, hi = honest.min(0).values, honest.max(0).values
        if name in ("coordinate_median", "trimmed_mean"):
            assert bool(((out >= lo) & (out <= hi)).all())
        assert out.abs().max() < 10


# ---- refusal, validation, non-finite rows ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "f", "n_ok", "n_bad"),
    [
        ("coordinate_median", 3, 7, 6),
        ("trimmed_mean", 3, 7, 6),
        ("centered_clip", 7, 15, 14),
        ("geometric_median", 2, 5, 4),
        ("krum", 3, 9, 8),
        ("multi_krum", 7, 17, 16),
    ],
)
def test_refuses_n_f_beyond_breakdown(name: str, f: int, n_ok: int, n_bad: int) -> None:
    from swarmtrain.core.errors import ConfigError

    r = build_reducer(name, f)
    r.check(n_ok)
    r.reduce(torch.randn(n_ok, 4), torch.ones(n_ok))
    with pytest.raises(ConfigError, match="cannot tolerate"):
        r.check(n_bad)
    with pytest.raises(ConfigError, match="cannot tolerate"):
        r.reduce(torch.randn(n_bad, 4), torch.ones(n_bad))


def test_bad_configs_and_inputs_raise_config_error() -> None:
    from swarmtrain.core.errors import ConfigError

    with pytest.raises(ConfigError):
        build_reducer("mean", 1)
    with pytest.raises(ConfigError):
        build_reducer("coordinate_median", -1)
    with pytest.raises(ConfigError):
        build_reducer("nope")
    with pytest.raises(ConfigError):
        build_reducer("centered_clip", 1, tau=-1.0)
    with pytest.raises(ConfigError):
        build_reducer("centered_clip", 1, bogus=3)
    with pytest.raises(ConfigError):
        build_reducer("trimmed_mean", 2, trim=1)
    r = build_reducer("coordinate_median", 1)
    with pytest.raises(ConfigError):
        r.reduce(torch.randn(5), torch.ones(5))
    with pytest.raises(ConfigError):
        r.reduce(torch.randn(5, 3), torch.ones(4))
    with pytest.raises(ConfigError):
        r.reduce(torch.randn(5, 3), -torch.ones(5))
    with pytest.raises(ConfigError):
        r.reduce(torch.ones(5, 3, dtype=torch.int64), torch.ones(5))
    with pytest.raises(ConfigError):
        build_reducer("mean").reduce(torch.randn(3, 2), torch.zeros(3))


@pytest.mark.parametrize("name", sorted(set(REDUCERS.names()) - {"mean"}))
def test_non_finite_rows_count_against_f(name: str) -> None:
    from swarmtrain.core.errors import UpdateRejected

    r = build_reducer(name, 2)
    n = r.min_peers(2)
    honest = torch.randn(n - 2, 8, generator=torch.Generator().manual_seed(0))
    stack = torch.cat([torch.full((1, 8), float("nan")), torch.full((1, 8), float("inf")), honest])
    out = r.reduce(stack, torch.ones(n))
    assert bool(torch.isfinite(out).all())
    # NaN rows are dropped, so the result equals reducing the rest with f lowered by two.
    torch.testing.assert_close(out, build_reducer(name, 0).reduce(honest, torch.ones(n - 2)))
    three_bad = stack.clone()
    three_bad[2, 0] = float("nan")
    with pytest.raises(UpdateRejected):
        r.reduce(three_bad, torch.ones(n))
    with pytest.raises(UpdateRejected):
        build_reducer("mean").reduce(stack, torch.ones(n))


# ---- determinism, dtypes, protocol -----------------------------------------------------------------


@pytest.mark.parametrize("name", REDUCERS.names())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_deterministic_and_dtype_preserving(name: str, dtype: torch.dtype) -> None:
    from swarmtrain.core.protocols import Reducer

    f = 0 if name == "mean" else 2
    r = build_reducer(name, f)
    assert isinstance(r, Reducer) and r.name == name
    x = _inputs(9, 300, 4, dtype)
    a = r.reduce(x, torch.ones(9))
    b = build_reducer(name, f).reduce(x.clone(), torch.ones(9))
    assert a.dtype == dtype and a.shape == (300,)
    assert torch.equal(a, b)
    assert r.reduce(x[:, :0], torch.ones(9)).shape == (0,)


def test_column_chunking_matches_single_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    import peers.reducers.base as base

    x = _inputs(9, 1000, 0)
    w = torch.ones(9, dtype=torch.float64)
    whole = {n: build_reducer(n, 0 if n == "mean" else 2).reduce(x, w) for n in REDUCERS.names()}
    monkeypatch.setattr(base, "CHUNK_ELEMENTS", 9 * 7)  # many ragged chunks
    for name, expected in whole.items():
        got = build_reducer(name, 0 if name == "mean" else 2).reduce(x, w)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_all_combinations_of_small_stacks_agree_with_reference_median() -> None:
    # Exhaustive tiny case: every arrangement of values 0..4 across 5 rows, one coordinate.
    r = build_reducer("coordinate_median", 2)
    for perm in itertools.permutations(range(5)):
        x = torch.tensor(perm, dtype=torch.float64)[:, None]
        assert float(r.reduce(x, torch.ones(5))[0]) == 2.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", REDUCERS.names())
def test_cuda_matches_cpu_and_is_deterministic(name: str) -> None:
    f = 0 if name == "mean" else 2
    x = _inputs(9, 5000, 1, torch.float32)
    w = torch.ones(9)
    cpu = build_reducer(name, f).reduce(x, w)
    a = build_reducer(name, f).reduce(x.cuda(), w.cuda())
    b = build_reducer(name, f).reduce(x.cuda(), w.cuda())
    assert a.device.type == "cuda" and torch.equal(a, b)
    torch.testing.assert_close(a.cpu(), cpu, rtol=1e-4, atol=1e-5)
