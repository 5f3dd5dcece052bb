"""A peer's state with the model on a device that is not the host, in process, on the emulated
``fakegpu`` accelerator (``tests/devices/fakegpu.py``: CUDA's ``Expected all tensors to be on the same
device`` wherever a device tensor meets a host tensor, and no ``.numpy()`` of a device tensor).

``tests/integration/test_device_guard.py`` runs whole peers on the device; this file checks, fast and
one at a time, the paths a GPU peer takes around its state:

* a donor's snapshot is all host tensors (it is what goes on the wire), goes through the donor's
  safetensors bytes and loads into a newcomer whose parameters, strategy state (anchor, outer
  momentum) and optimizer moments end on the device, bit-identical to the donor's, and who trains on;
* a checkpoint and a peer's own saved state (``swarmtrain.app.peer.saved_state``, read at join) do the same;
* the outer store keeps the parameters on the device in every ``outer_state`` mode, and its state
  loads across modes;
* every registered reducer returns its aggregate on the stack's device, equal to the host result;
  error feedback keeps its residual on the input's device and sends the packet the host would.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "devices"))
import fakegpu  # noqa: E402  (registers the emulated device)

from compression.blockwise import Int8Compressor  # noqa: E402
from compression.feedback import ErrorFeedback  # noqa: E402
from optimizers.inprocess import InProcessGroup  # noqa: E402
from optimizers.outer_store import OuterStore  # noqa: E402
from peers.reducers import REDUCERS, build_reducer  # noqa: E402
from peers.state.state_transfer import parse_state, serialize_state  # noqa: E402
from swarmtrain.app.peer.saved_state import read_saved_state, save_state  # noqa: E402
from swarmtrain.app.peer.state import (  # noqa: E402
    apply_state,
    param_digest,
    shared_digest,
    state_snapshot,
)
from swarmtrain.app.train.checkpoint import pack_state  # noqa: E402
from swarmtrain.app.train.trainer import Trainer  # noqa: E402
from swarmtrain.core.config import OuterLoopConfig, load_config, strategy_config  # noqa: E402

DEV = fakegpu.DEVICE
MODES = ("device", "cpu", "cpu8")


# --------------------------------------------------------------------------------------- helpers
def _trainer(out: Path, outer_state: str = "device") -> Trainer:
    """A tiny DiLoCo peer on fakegpu; a group of one stands in for the swarm (no network)."""
    cfg = load_config(
        env={},
        overrides={
            "model.n_layer": 1,
            "model.n_head": 2,
            "model.n_embd": 16,
            "model.block_size": 16,
            "model.dropout": 0.0,  # no RNG in the step: two trainers with one state step alike
            "data.max_bytes": 50_000,
            "train.batch_size": 2,
            "train.grad_accum": 1,
            "train.steps": 20,
            "train.warmup_steps": 1,
            "train.eval_batches": 1,
            "train.device": "fakegpu",
            "train.progress": False,
            "train.out_dir": str(out),
            "strategy.name": "diloco",
            "strategy.inner_steps": 2,
            "strategy.outer_momentum": 0.9,
            "strategy.outer_state": outer_state,
        },
    )
    return Trainer(cfg, collective=InProcessGroup(1)[0])


def _tensors(tree: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a nested state, with its path."""
    if isinstance(tree, torch.Tensor):
        yield path, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from _tensors(v, f"{path}.{k}")
    elif isinstance(tree, list | tuple):
        for i, v in enumerate(tree):
            yield from _tensors(v, f"{path}.{i}")


def _params(t: Trainer) -> dict[str, torch.Tensor]:
    return dict(t.model.named_parameters())


def _state_digest(tree: Any) -> str:
    """``param_digest`` of a state's tensors, packed to the host (the bytes a peer would send); 0-dim
    ones (step counters) flattened, as ``param_digest`` views each tensor as bytes."""
    return param_digest({k: v.reshape(-1) for k, v in pack_state(tree)[0].items()})


def _assert_on_device(t: Trainer) -> None:
    """Parameters, the optimizer's moments and the strategy's device-side state live on fakegpu.

    Step counters of AdamW are 0-dim host tensors, as on CUDA; the anchor and momentum live on the
    host in the ``cpu``/``cpu8`` modes by design."""
    assert all(fakegpu.on_fakegpu(p) for p in t.model.parameters())
    moments = [(n, v) for n, v in _tensors(t.optimizer.state_dict()["state"]) if v.dim() > 0]
    assert moments and all(fakegpu.on_fakegpu(v) for _, v in moments), [(n, v.device) for n, v in moments]
    store = t.strategy.store  # type: ignore[attr-defined]
    home = "fakegpu" if store.mode == "device" else "cpu"
    assert store.anchor and all(a.device.type == home for a in store.anchor.values())
    assert all(m.device.type == home for m in store.momentum.values())
    assert all(fakegpu.on_fakegpu(store.anchor_on_device(n)) for n in store.anchor)


def _same_state(a: Trainer, b: Trainer) -> None:
    assert param_digest(_params(a)) == param_digest(_params(b))
    assert shared_digest(a) == shared_digest(b)
    assert _state_digest(a.strategy.state_dict()) == _state_digest(b.strategy.state_dict())
    assert _state_digest(a.optimizer.state_dict()["state"]) == _state_digest(
        b.optimizer.state_dict()["state"]
    )
    assert a.step == b.step


def _train_on(a: Trainer, b: Trainer) -> None:
    """Both take one more step (a sync step: the outer store runs) and stay bit-identical."""
    ra, rb = a.train_step()[2], b.train_step()[2]
    assert ra.synced and rb.synced and ra.committed and rb.committed
    _assert_on_device(b)
    _same_state(a, b)


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine; also one float reduction order
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------ 1. download and apply
@pytest.mark.parametrize("mode", MODES)
def test_downloaded_state_lands_on_the_device(tmp_path: Path, mode: str) -> None:
    a, b = _trainer(tmp_path / "a", mode), _trainer(tmp_path / "b", mode)
    for _ in range(3):  # one outer step (the momentum exists), then one inner step past it
        a.train_step()
    _assert_on_device(a)
    tensors, meta = state_snapshot(a, round_id=1)
    for part in ("model.", "strategy.", "optimizer."):
        assert any(k.startswith(part) for k in tensors), part
    wrong = [k for k, v in tensors.items() if v.device.type != "cpu"]
    assert not wrong, f"a snapshot holds device tensors: {wrong[:5]}"
    got, got_meta = parse_state(serialize_state(tensors, meta))  # the donor's bytes on the wire
    assert apply_state(b, got, got_meta) == 1
    _assert_on_device(b)
    _same_state(a, b)
    _train_on(a, b)


# -------------------------------------------------------------------------------- 2. saved state
def test_checkpoint_round_trips_on_the_device(tmp_path: Path) -> None:
    a = _trainer(tmp_path / "a")
    for _ in range(3):
        a.train_step()
    a.save_checkpoint(tmp_path / "ck")
    b = _trainer(tmp_path / "b")
    b.load_checkpoint(tmp_path / "ck")
    _assert_on_device(b)
    _same_state(a, b)
    _train_on(a, b)


def test_own_saved_state_loads_on_the_device(tmp_path: Path) -> None:
    """The file a volunteer writes after each committed round and loads at join (``adopt_saved_state``
    loads it with ``apply_state`` and checks the shared digest)."""
    a = _trainer(tmp_path / "a", "cpu8")
    for _ in range(3):
        a.train_step()
    path = tmp_path / "id.key.state.safetensors"
    tensors, meta = state_snapshot(a, round_id=2)
    assert save_state(path, tensors, meta, run_id="run", digest=shared_digest(a))
    saved = read_saved_state(path, "run")
    assert saved is not None and saved.round == 2
    b = _trainer(tmp_path / "b", "cpu8")
    assert apply_state(b, saved.tensors, saved.meta) == 2
    assert shared_digest(b) == saved.digest
    _assert_on_device(b)
    _same_state(a, b)
    _train_on(a, b)


# --------------------------------------------------------------------------- 3. outer store modes
def _outer_cfg(mode: str) -> OuterLoopConfig:
    cfg = strategy_config("diloco", outer_lr=0.7, outer_momentum=0.9, nesterov=True, outer_state=mode)
    assert isinstance(cfg, OuterLoopConfig)
    return cfg


def _outer_run(
    device: torch.device | str, mode: str, steps: int = 2
) -> tuple[dict[str, torch.Tensor], OuterStore]:
    """``steps`` outer steps of a store over two parameters on ``device`` (seeded gradients)."""
    g = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(4, 300, generator=g), "b": torch.randn(7, generator=g)}
    params = {n: p.to(device) for n, p in params.items()}
    store = OuterStore(params, _outer_cfg(mode))
    for _ in range(steps):
        grads = {n: torch.randn(p.shape, generator=g).to(device) for n, p in params.items()}

        def apply(name: str, anchor: torch.Tensor) -> None:
            params[name].copy_(anchor)

        store.step(grads, apply)
    return params, store


@pytest.mark.parametrize("mode", MODES)
def test_outer_store_keeps_parameters_on_the_device(mode: str) -> None:
    params, store = _outer_run(DEV, mode)
    assert all(fakegpu.on_fakegpu(p) for p in params.values())
    assert all(fakegpu.on_fakegpu(store.anchor_on_device(n)) for n in params)
    home = "fakegpu" if mode == "device" else "cpu"
    assert all(a.device.type == home for a in store.anchor.values())
    ref, _ = _outer_run("cpu", mode)  # the host computes the same numbers, bit for bit
    for n, p in params.items():
        assert torch.equal(p.cpu(), ref[n]), n


@pytest.mark.parametrize("src", MODES)
@pytest.mark.parametrize("dst", MODES)
def test_outer_state_loads_across_modes_on_the_device(src: str, dst: str) -> None:
    params, store = _outer_run(DEV, src)
    anchor, outer = store.anchor_state(), store.outer_state()
    target = OuterStore(params, _outer_cfg(dst))
    target.load(anchor, outer)
    home = "fakegpu" if dst == "device" else "cpu"
    assert all(a.device.type == home for a in target.anchor.values())
    assert all(m.device.type == home for m in target.momentum.values())
    for n in params:
        assert torch.equal(target.anchor_on_device(n).cpu(), store.anchor_on_device(n).cpu())
        mine, theirs = target.momentum_fp32(n), store.momentum_fp32(n)
        assert mine is not None and theirs is not None
        if dst == "cpu8" and src != "cpu8":  # stored 8-bit: within the int8 codec's bound
            assert torch.allclose(mine, theirs, rtol=0, atol=float(theirs.abs().max()) / 127)
        else:
            assert torch.equal(mine, theirs)
    grads = {n: torch.ones(p.shape).to(DEV) for n, p in params.items()}  # one more step after the load

    def apply(name: str, a: torch.Tensor) -> None:
        params[name].copy_(a)

    target.step(grads, apply)
    assert all(fakegpu.on_fakegpu(p) for p in params.values())


# ------------------------------------------------------------------- 4. reducers, error feedback
@pytest.mark.parametrize("name", REDUCERS.names())
def test_reducers_answer_on_the_stack_device(name: str) -> None:
    g = torch.Generator().manual_seed(1)
    stack = torch.randn(7, 97, generator=g)
    stack[3] += 50.0  # one outlier row, so the robust reducers have something to do
    weights = torch.rand(7, generator=g) + 0.5
    f = 0 if name == "mean" else 1  # the plain mean tolerates no Byzantine row
    host = build_reducer(name, n_byzantine=f).reduce(stack, weights)
    dev = build_reducer(name, n_byzantine=f).reduce(stack.to(DEV), weights.to(DEV))
    assert fakegpu.on_fakegpu(dev) and dev.shape == host.shape and dev.dtype == host.dtype
    assert torch.allclose(dev.cpu(), host, rtol=1e-5, atol=1e-6)
    # weights left on the host (as a caller may build them) do not break a device stack either
    mixed = build_reducer(name, n_byzantine=f).reduce(stack.to(DEV), weights)
    assert fakegpu.on_fakegpu(mixed) and torch.allclose(mixed.cpu(), host, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("codec_device", ["cpu", "fakegpu"])
def test_error_feedback_residual_stays_on_the_input_device(codec_device: str) -> None:
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(3, 130, generator=g) for _ in range(3)]
    on_dev, on_host = ErrorFeedback(Int8Compressor(device=codec_device)), ErrorFeedback(Int8Compressor())
    for i, x in enumerate(xs):
        p_dev, p_host = on_dev.compress(x.to(DEV), key="w"), on_host.compress(x, key="w")
        assert p_dev == p_host, f"step {i}: the device packet differs from the host's"
        r = on_dev.residual("w")
        assert r is not None and fakegpu.on_fakegpu(r) and r.dtype == torch.float64
        host_r = on_host.residual("w")
        assert host_r is not None and torch.equal(r.cpu(), host_r)
    # spans (the butterfly's path) too, and a state saved on the host loads back for a device input
    span_dev, span_host = ErrorFeedback(Int8Compressor(device=codec_device)), ErrorFeedback(Int8Compressor())
    flat = xs[0].reshape(-1)
    assert span_dev.compress_span(flat[:200].to(DEV), key="f", lo=0, total=390) == span_host.compress_span(
        flat[:200], key="f", lo=0, total=390
    )
    assert fakegpu.on_fakegpu(span_dev.residual("f"))  # type: ignore[arg-type]
    state = on_dev.state_dict()
    assert all(v.device.type == "cpu" for v in state["memory"].values())
    again = ErrorFeedback(Int8Compressor(device=codec_device))
    again.load_state_dict(state)
    assert again.compress(xs[0].to(DEV), key="w") == on_host.compress(xs[0], key="w")
    r = again.residual("w")
    assert r is not None and fakegpu.on_fakegpu(r)
