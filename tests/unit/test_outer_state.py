"""``strategy.outer_state``: the anchor and outer momentum on the device, in CPU memory, or 8-bit.

"cpu" must end bit-identical to "device" (DiLoCo and Streaming DiLoCo, several workers); "cpu8"
keeps every worker identical and each outer step within the stated bound of the exact momentum's;
state dicts load across modes. The CUDA variants (pinned memory, non-blocking copies) run only where a
CUDA device is present; the CPU variants always run and go through the same copy-out/step/copy-back
code.
"""

from __future__ import annotations

import copy
from typing import Any

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

from optimizers.outer_store import (
    MOMENTUM_BLOCK,
    OuterStateBytes,
    OuterStore,
    momentum_step_bound,
    outer_state_bytes_per_param,
)
from swarmtrain.app.train.checkpoint import pack_state, unpack_state
from swarmtrain.core.config import strategy_config
from swarmtrain.core.errors import ConfigError

MODES = ("device", "cpu", "cpu8")
STREAMING: dict[str, Any] = {"inner_steps": 4, "fragments": 2, "overlap": 1, "mixing": 0.5}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

Trace = list[dict[str, torch.Tensor]]


def _run(
    name: str,
    n: int,
    steps: int,
    device: str = "cpu",
    **options: Any,
) -> tuple[list[Trace], list[dict[str, torch.Tensor]], list[dict[str, Any]]]:
    """``n`` in-process workers for ``steps`` steps: per worker, the global parameters after every
    synced step, the final local parameters and the final strategy state."""
    group = InProcessGroup(n)
    traces: list[Trace] = [[] for _ in range(n)]
    finals: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
    states: list[dict[str, Any]] = [{} for _ in range(n)]

    def peer(i: int) -> None:
        model = make_model().to(device)
        strat = make_strategy(name, model, make_optimizer(model), group[i], **options)
        for s in range(steps):
            x, y = batch(i, s)
            backward(model, x.to(device), y.to(device))
            if strat.step(16 + i).synced:
                traces[i].append({k: v.cpu() for k, v in strat.global_parameters().items()})  # type: ignore[attr-defined]
        states[i] = copy.deepcopy(strat.state_dict())
        strat.close()
        finals[i] = {k: v.cpu() for k, v in params_of(model).items()}

    run_threads(peer, n)
    return traces, finals, states


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same keys; tensors bit-identical (on any device), other values equal."""

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            return x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu())
        return bool(x == y)

    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)


def _momentum(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The fp32 momentum a state holds (decoding ``buffers_int8``) through a fresh store."""
    cfg = strategy_config("diloco", outer_state="cpu")
    assert isinstance(cfg, type(strategy_config("diloco")))
    model = make_model()
    params = {n: p for n, p in model.named_parameters()}
    store = OuterStore(params, cfg)  # type: ignore[arg-type]
    store.load(state["anchor"], state["outer"])
    out = {}
    for n in params:
        m = store.momentum_fp32(n)
        if m is not None:
            out[n] = m
    return out


# ------------------------------------------------------------------------------------------- bytes
def test_bytes_per_param_of_each_mode() -> None:
    def b(name: str, **kw: Any) -> OuterStateBytes:
        return outer_state_bytes_per_param(strategy_config(name, **kw))

    assert b("diloco") == OuterStateBytes(device=8.0, host=0.0)
    assert b("diloco", outer_state="cpu") == OuterStateBytes(device=0.0, host=8.0)
    assert b("streaming_diloco", outer_state="cpu8") == OuterStateBytes(0.0, 4.0 + 1.0 + 4.0 / MOMENTUM_BLOCK)
    assert b("diloco", outer_state="cpu8", outer_momentum=0.0) == OuterStateBytes(0.0, 4.0)
    assert b("diloco", outer_momentum=0.0) == OuterStateBytes(4.0, 0.0)
    assert b("demo") == b("data_parallel") == b("local") == OuterStateBytes(0.0, 0.0)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="outer_state"):
        strategy_config("diloco", outer_state="gpu")


# ------------------------------------------------------------------------------- "cpu" == "device"
def test_cpu_store_copies_out_and_back() -> None:
    """The CPU path really works on copies, also where the device is the CPU."""
    model = make_model()
    strat = make_strategy("diloco", model, make_optimizer(model), InProcessGroup(1)[0], outer_state="cpu")
    store = strat.store  # type: ignore[attr-defined]
    name, p = next(iter(model.named_parameters()))
    a = store.anchor_on_device(name)
    assert a.data_ptr() != store.anchor[name].data_ptr() != p.data_ptr()
    assert torch.equal(a, store.anchor[name]) and store.anchor[name].device.type == "cpu"
    assert strat.anchor is store.anchor  # type: ignore[attr-defined]


@pytest.mark.parametrize("n", [2, 4])
def test_diloco_cpu_ends_identical_to_device(n: int) -> None:
    runs = {m: _run("diloco", n, 13, inner_steps=3, outer_state=m) for m in ("device", "cpu")}
    (tr_d, fin_d, st_d), (tr_c, fin_c, st_c) = runs["device"], runs["cpu"]
    assert len(tr_d[0]) == 4
    for i in range(n):
        assert all(_equal(a, b) for a, b in zip(tr_d[i], tr_c[i], strict=True)), f"worker {i}"
        assert _equal(fin_d[i], fin_c[i]), f"worker {i}"
        assert _equal(st_d[i]["anchor"], st_c[i]["anchor"])
        assert _equal(st_d[i]["outer"]["buffers"], st_c[i]["outer"]["buffers"])
        assert all(_equal(tr_c[0][k], tr_c[i][k]) for k in range(4))  # workers agree


def test_streaming_diloco_cpu_ends_identical_to_device() -> None:
    n = 3
    runs = {m: _run("streaming_diloco", n, 14, outer_state=m, **STREAMING) for m in ("device", "cpu")}
    (tr_d, fin_d, st_d), (tr_c, fin_c, st_c) = runs["device"], runs["cpu"]
    assert len(tr_d[0]) >= 6
    for i in range(n):
        assert all(_equal(a, b) for a, b in zip(tr_d[i], tr_c[i], strict=True)), f"worker {i}"
        assert _equal(fin_d[i], fin_c[i]), f"worker {i}"
        assert _equal(st_d[i]["outer"]["buffers"], st_c[i]["outer"]["buffers"])
    assert not _equal(fin_c[0], fin_c[1])  # mixing keeps local models apart; globals agree:
    assert all(_equal(tr_c[0][k], tr_c[1][k]) for k in range(len(tr_c[0])))


@pytest.mark.parametrize(
    ("mode", "options"),
    [
        ("cpu", {"nesterov": False}),  # heavy ball
        ("cpu", {"outer_momentum": 0.0}),
        ("cpu8", {"outer_momentum": 0.0}),  # no momentum to quantise: exact
        ("cpu", {"model_dtype": torch.bfloat16}),
    ],
)
def test_other_outer_settings_match_device(mode: str, options: dict[str, Any]) -> None:
    opts = dict(options)
    dtype = opts.pop("model_dtype", torch.float32)
    finals = []
    for m in ("device", mode):
        model = make_model().to(dtype)
        strat = make_strategy(
            "diloco", model, make_optimizer(model), InProcessGroup(1)[0], outer_state=m, inner_steps=3, **opts
        )
        for s in range(10):
            x, y = batch(0, s)
            backward(model, x.to(dtype), y.to(dtype))
            strat.step(16)
        finals.append((params_of(model), strat.state_dict()))
    assert _equal(finals[0][0], finals[1][0])
    assert _equal(finals[0][1]["anchor"], finals[1][1]["anchor"])
    assert _equal(finals[0][1]["outer"]["buffers"], finals[1][1]["outer"]["buffers"])


@needs_cuda
@pytest.mark.parametrize("name", ["diloco", "streaming_diloco"])
def test_cuda_pinned_ends_identical_to_device(name: str) -> None:
    opts: dict[str, Any] = STREAMING if name == "streaming_diloco" else {"inner_steps": 3}
    dev = _run(name, 2, 13, device="cuda", outer_state="device", **opts)
    pin = _run(name, 2, 13, device="cuda", outer_state="cpu", **opts)
    for i in range(2):
        assert all(_equal(a, b) for a, b in zip(dev[0][i], pin[0][i], strict=True))
        assert _equal(dev[1][i], pin[1][i])
    model = make_model().to("cuda")
    strat = make_strategy(name, model, make_optimizer(model), InProcessGroup(1)[0], outer_state="cpu", **opts)
    store = strat.store  # type: ignore[attr-defined]
    assert store.pinned and all(t.is_pinned() for t in store.anchor.values())
    strat.close()  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------ "cpu8"
@pytest.mark.parametrize("nesterov", [True, False])
def test_cpu8_store_stays_within_the_bound_over_many_steps(nesterov: bool) -> None:
    """Same gradients into an exact and an 8-bit store: the stated bound holds after every step.

    With ``e_k`` the stored momentum's error after step k (``|e_k| <= q_k + mu |e_(k-1)|``,
    ``q_k = absmax_k / 254`` of the momentum being stored), step k moves the parameters by at most
    ``lr * c * |e_(k-1)|`` away from the exact step, ``c = mu**2`` (Nesterov) or ``mu``.
    """
    torch.manual_seed(3)
    lr, mu = 0.7, 0.9
    shape = (37, 29)  # 1073 elements: a short last block
    params = {"w": torch.randn(shape)}
    stores = {
        m: OuterStore(params, strategy_config("diloco", outer_state=m, nesterov=nesterov))  # type: ignore[arg-type]
        for m in ("device", "cpu8")
    }
    err = torch.zeros(shape)  # bound on |e_(k-1)|
    drift = torch.zeros(shape)  # bound on the parameters' difference
    c = mu**2 if nesterov else mu
    worst = 0.0
    for k in range(12):
        g = torch.randn(shape) * (0.1 if k % 3 else 1.0)
        prev = stores["cpu8"].momentum_fp32("w")
        stored = g.clone() if prev is None else prev * mu + g  # what the 8-bit store quantises
        for s in stores.values():
            s.step({"w": g}, lambda n, a: None)
        drift += lr * c * err
        q = momentum_step_bound(stored, 1.0, 1.0, False)  # absmax / 254 per element (+ margin)
        err = q + mu * err
        diff = (stores["cpu8"].anchor["w"] - stores["device"].anchor["w"]).abs()
        slack = 1e-6 * stores["device"].anchor["w"].abs()  # fp32 rounding of the two paths
        assert torch.all(diff <= drift + slack), k
        mdiff = (stores["cpu8"].momentum_fp32("w") - stores["device"].momentum["w"]).abs()  # type: ignore[operator]
        assert torch.all(mdiff <= err * (1 + 1e-5) + 1e-7), k
        worst = max(worst, float((diff / (drift + slack).clamp_min(1e-30)).max()))
    assert 0 < worst <= 1


def _state_after(mode: str, steps: int, **opts: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    model = make_model()
    opt = make_optimizer(model)
    strat = make_strategy("diloco", model, opt, InProcessGroup(1)[0], outer_state=mode, **opts)
    for s in range(steps):
        backward(model, *batch(0, s))
        strat.step(16)
    return model, opt, strat, copy.deepcopy(strat.state_dict())


def _clone(model: Any, opt: Any, mode: str, state: dict[str, Any], **opts: Any) -> tuple[Any, Any]:
    m2 = make_model(seed=7)
    m2.load_state_dict(copy.deepcopy(model.state_dict()))
    o2 = make_optimizer(m2)
    o2.load_state_dict(copy.deepcopy(opt.state_dict()))
    s2 = make_strategy("diloco", m2, o2, InProcessGroup(1)[0], outer_state=mode, **opts)
    s2.load_state_dict(copy.deepcopy(state))
    return m2, s2


def test_cpu8_one_sync_within_the_stated_bound_of_device() -> None:
    """From one state, the next sync's parameters differ by at most lr * mu**2 * absmax / 254."""
    model, opt, strat, state = _state_after("device", 10, inner_steps=4)  # 2 outer steps, mid-cycle
    buf = _momentum(state)
    _, s8 = _clone(model, opt, "cpu8", state, inner_steps=4)
    m8 = s8.ctx.model  # type: ignore[attr-defined]
    for s in range(10, 12):  # to the next sync, on both
        for m, st in ((model, strat), (m8, s8)):
            backward(m, *batch(0, s))
            rep = st.step(16)
    assert rep.synced and rep.committed
    for n, p in params_of(model).items():
        bound = momentum_step_bound(buf[n], 0.7, 0.9, True) + 1e-6 * p.abs()
        diff = (params_of(m8)[n] - p).abs()
        assert torch.all(diff <= bound), n
        assert torch.equal(params_of(m8)[n], s8.anchor[n])  # type: ignore[attr-defined]
    assert any(not torch.equal(params_of(m8)[n], p) for n, p in params_of(model).items())  # it is lossy


@pytest.mark.parametrize("name", ["diloco", "streaming_diloco"])
def test_cpu8_workers_stay_identical(name: str) -> None:
    n = 3
    opts: dict[str, Any] = STREAMING if name == "streaming_diloco" else {"inner_steps": 3}
    tr8, fin8, st8 = _run(name, n, 12, outer_state="cpu8", **opts)  # DiLoCo ends on a sync
    trd, _, _ = _run(name, n, 12, outer_state="device", **opts)
    assert len(tr8[0]) >= 4
    for i in range(1, n):
        assert all(_equal(a, b) for a, b in zip(tr8[0], tr8[i], strict=True)), f"worker {i}"
        assert _equal(st8[0]["anchor"], st8[i]["anchor"])
        a8, b8 = st8[0]["outer"]["buffers_int8"], st8[i]["outer"]["buffers_int8"]
        assert a8.keys() == b8.keys() and all(_equal(a8[k], b8[k]) for k in a8)
    if name == "diloco":
        assert all(_equal(fin8[0], f) for f in fin8)
    # lossy but close: after 4 syncs the drift measured 1e-3 (DiLoCo) and 3e-4 (Streaming) of the
    # largest parameter
    last8, lastd = tr8[0][-1], trd[0][-1]
    rel = max(float((last8[k] - lastd[k]).abs().max() / lastd[k].abs().max()) for k in lastd)
    assert 0 < rel < 1e-2


# ------------------------------------------------------------------------------- state round trips
@pytest.mark.parametrize("src", MODES)
@pytest.mark.parametrize("dst", MODES)
def test_state_dict_loads_across_modes(src: str, dst: str) -> None:
    model, opt, strat, state = _state_after(src, 10, inner_steps=4)
    assert_plain(state)
    tensors, skeleton = pack_state(state, prefix="strategy")  # the checkpoint/download format
    state = unpack_state(skeleton, tensors)
    m2, s2 = _clone(model, opt, dst, state, inner_steps=4)
    back = s2.state_dict()
    assert _equal(back["anchor"], state["anchor"])
    mom_src, mom_back = _momentum(state), _momentum(back)
    assert mom_src.keys() == mom_back.keys() and mom_src
    if src == "cpu8" and dst == "cpu8":  # the codes themselves travel
        assert all(
            _equal(back["outer"]["buffers_int8"][k], state["outer"]["buffers_int8"][k]) for k in mom_src
        )
    if dst != "cpu8" or src == "cpu8":  # exact: decoded or fp32 momentum as saved
        assert _equal(mom_src, mom_back)
    else:  # fp32 -> 8-bit: within the codec's bound
        for k, v in mom_src.items():
            assert torch.all((mom_back[k] - v).abs() <= momentum_step_bound(v, 1.0, 1.0, False) + 1e-7)
    exact = {src, dst} <= {"device", "cpu"} or src == dst
    if exact:  # and training continues bit-identically
        for s in range(10, 19):
            for m, st in ((model, strat), (m2, s2)):
                backward(m, *batch(0, s))
                st.step(16)
        assert _equal(params_of(model), params_of(m2))
        assert _equal(strat.state_dict()["anchor"], s2.state_dict()["anchor"])


def test_bad_momentum_state_is_refused_and_changes_nothing() -> None:
    model, _, strat, state = _state_after("cpu8", 10, inner_steps=4)
    before = copy.deepcopy(strat.state_dict())
    bad = copy.deepcopy(state)
    k = next(iter(bad["outer"]["buffers_int8"]))
    bad["outer"]["buffers_int8"][k]["codes"] = bad["outer"]["buffers_int8"][k]["codes"][:-1]
    with pytest.raises(ConfigError, match="does not decode"):
        strat.load_state_dict(bad)
    bad = copy.deepcopy(state)
    bad["outer"]["buffers"] = {"nope": torch.zeros(2)}
    with pytest.raises(ConfigError, match="momentum 'nope'"):
        strat.load_state_dict(bad)
    # a donor's hyper-parameters that would wreck every later outer step (issue 13's state fuzz)
    for field, value, why in [
        ("lr", float("nan"), "lr must be finite"),
        ("lr", -0.7, "lr must be finite"),
        ("momentum", 5.0, r"momentum must be in \[0, 1\)"),
        ("momentum", -0.1, r"momentum must be in \[0, 1\)"),
    ]:
        bad = copy.deepcopy(state)
        bad["outer"][field] = value
        with pytest.raises(ConfigError, match=why):
            strat.load_state_dict(bad)
    assert strat.state_dict()["outer"]["lr"] == before["outer"]["lr"]
    after = strat.state_dict()
    assert _equal(after["anchor"], before["anchor"])
    assert all(
        _equal(after["outer"]["buffers_int8"][n], v) for n, v in before["outer"]["buffers_int8"].items()
    )
