"""Shared pieces of the strategy unit tests: a tiny block model, data, an fp32 codec, thread runners."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import torch

from optimizers import InProcessGroup, StrategyContext, build_strategy
from swarmtrain.core.config import CompressionConfig, strategy_config
from swarmtrain.core.packet import Packet
from swarmtrain.core.protocols import Collective, Compressor, Strategy

T = TypeVar("T")

DIM = 8


class IdentityCompressor:
    """Lossless fp32 codec (``codec="none"``), stateless."""

    name = "none"

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        arr = t.detach().to(torch.float32).cpu().contiguous().numpy()
        return Packet("none", tuple(t.shape), "float32", (arr.astype("<f4").tobytes(),))

    def decompress(self, p: Packet) -> torch.Tensor:
        arr = np.frombuffer(p.buffers[0], dtype="<f4").copy()
        return torch.from_numpy(arr).reshape(p.shape)


class TinyBlocks(torch.nn.Module):
    """Embedding-like input layer, ``n_blocks`` residual blocks in a ModuleList, a head."""

    def __init__(self, n_blocks: int = 4, dim: int = DIM) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, dim)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(n_blocks))
        self.head = torch.nn.Linear(dim, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = h + torch.tanh(b(h))
        return self.head(h)


_INIT_LOCK = threading.Lock()


def make_model(seed: int = 0, n_blocks: int = 4) -> TinyBlocks:
    """Same ``seed`` -> same weights, also when called from several threads at once."""
    with _INIT_LOCK:
        torch.manual_seed(seed)
        return TinyBlocks(n_blocks)


def batch(peer: int, step: int, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic regression batch for (peer, step)."""
    g = torch.Generator().manual_seed(1000 * step + peer)
    x = torch.randn(size, 4, generator=g)
    y = torch.stack([x[:, 0] * x[:, 1], torch.sin(x[:, 2]) + x[:, 3]], dim=1)
    return x, y


def backward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return float(loss.detach())


def make_optimizer(model: torch.nn.Module, lr: float = 1e-2) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)


def make_strategy(
    name: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    collective: Collective | None,
    compressor: Compressor | None = None,
    **options: Any,
) -> Strategy:
    cfg = strategy_config(name, **options)
    ctx = StrategyContext(
        model=model,
        optimizer=optimizer,
        config=cfg,
        compression=CompressionConfig(),
        collective=collective,
        compressor=compressor if compressor is not None else IdentityCompressor(),
    )
    return build_strategy(ctx)


def run_threads(fn: Callable[[int], T], n: int, timeout: float = 60.0) -> list[T]:
    """Run ``fn(i)`` for ``i < n`` in threads; re-raise the first exception; hang guard ``timeout``."""
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            results[i] = fn(i)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)

    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError("strategy thread hung")
    if errors:
        raise errors[0]
    return results


def params_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer, strat: Strategy) -> dict[str, Any]:
    return {
        "model": copy.deepcopy(model.state_dict()),
        "opt": copy.deepcopy(opt.state_dict()),
        "strategy": copy.deepcopy(strat.state_dict()),
    }


def assert_plain(value: Any, path: str = "state") -> None:
    """A checkpoint can store it: tensors, ints, floats, strs, bools, and lists/dicts of those."""
    if isinstance(value, torch.Tensor | bool | int | float | str):
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            assert_plain(v, f"{path}[{i}]")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            assert isinstance(k, str), f"{path}: non-string key {k!r}"
            assert_plain(v, f"{path}.{k}")
        return
    raise AssertionError(f"{path}: {type(value).__name__} is not checkpointable")


__all__ = [
    "IdentityCompressor",
    "TinyBlocks",
    "make_model",
    "batch",
    "backward",
    "make_optimizer",
    "make_strategy",
    "run_threads",
    "params_of",
    "snapshot",
    "assert_plain",
    "InProcessGroup",
]
