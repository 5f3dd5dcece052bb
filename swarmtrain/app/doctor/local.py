"""Doctor checks that need no other peer: the p2p daemon starts, training throughput, memory."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from swarmtrain.app.doctor.result import Check
from swarmtrain.app.train.memory_budget import memory_budget
from swarmtrain.core.config import Config

__all__ = ["check_daemon", "check_throughput", "check_memory", "human_rate", "HEADROOM"]

#: a budget that fills more than this share of the free memory is tight (``warn``)
HEADROOM = 0.8
MiB = 1 << 20


def human_rate(x: float, unit: str) -> str:
    """``4100.0, "tok/s"`` -> ``"4.1k tok/s"``; ``2.5e6, "B/s"`` -> ``"2.5 MB/s"``."""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            if unit.startswith("B"):
                return f"{x / scale:.1f} {prefix}{unit}"
            return f"{x / scale:.1f}{prefix} {unit}"
    return f"{x:.0f} {unit}"


def check_daemon(timeout: float) -> Check:
    """Start a hivemind p2p daemon (``p2pd``) on loopback, time it, stop it."""
    from hivemind.p2p import P2P

    async def _start_stop() -> float:
        t0 = time.perf_counter()
        p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], startup_timeout=timeout)
        took = time.perf_counter() - t0
        await p2p.shutdown()
        return took

    try:
        took = asyncio.run(asyncio.wait_for(_start_stop(), timeout + 5.0))
    except Exception as e:  # a missing or foreign binary, a timeout: all mean "does not start"
        return Check("p2p daemon", "fail", "-", f"p2pd did not start: {type(e).__name__}: {e}"[:200])
    return Check("p2p daemon", "ok", f"{took:.2f} s", "p2pd starts on loopback", {"start_s": took})


def check_throughput(cfg: Config, device: str, *, steps: int = 5, max_s: float = 20.0) -> Check:
    """Time a few training steps of ``cfg``'s model on ``device`` (``cpu`` or ``cuda``), alone (the
    ``local`` strategy, whatever the run's is: the inner steps are what a volunteer computes).

    Two warm-up steps first (allocator, kernels); then up to ``steps`` steps or ``max_s`` seconds.
    """
    import torch

    from swarmtrain.app.train.trainer import Trainer
    from swarmtrain.core.config import strategy_config

    name = f"throughput {device}"
    run_cfg = cfg.model_copy(  # the run's model, alone: a networked strategy would need its peers
        update={
            "train": cfg.train.model_copy(update={"device": device, "compile": False}),
            "strategy": strategy_config("local"),
        }
    )
    trainer: Any = None
    try:
        trainer = Trainer(run_cfg)
        for _ in range(2):
            trainer.train_step()
        if device == "cuda":
            torch.cuda.synchronize()
        n, t0 = 0, time.perf_counter()
        while n < steps and (n == 0 or time.perf_counter() - t0 < max_s):
            trainer.train_step()
            n += 1
        if device == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    except Exception as e:  # out of memory, a broken CUDA install: the device cannot train this model
        return Check(name, "fail", "-", f"a training step failed: {type(e).__name__}: {e}"[:200])
    finally:
        if trainer is not None:
            trainer.close()
    tok_s = trainer.tokens_per_step * n / wall
    detail = f"{cfg.model.preset}: {wall / n:.2f} s/step, {trainer.tokens_per_step} tokens/step"
    return Check(
        name,
        "ok",
        human_rate(tok_s, "tok/s"),
        detail,
        {"tokens_per_s": tok_s, "step_s": wall / n, "steps": n, "preset": cfg.model.preset},
    )


def _fit(need: int, free: int) -> tuple[str, str]:
    """``(status, words)`` for a budget of ``need`` bytes against ``free`` bytes."""
    if need > free:
        return "fail", "does not fit"
    if need > HEADROOM * free:
        return "warn", "fits, tight"
    return "ok", "fits"


def check_memory(cfg: Config, cuda: bool) -> Check:
    """Free RAM (and GPU memory, with ``cuda``) against what ``memory_budget`` says the model needs.

    ``fail`` only when the model fits on no device; the figure is the best device's need / free.
    """
    import psutil
    import torch

    host_free = int(psutil.virtual_memory().available)
    cpu_need = memory_budget(cfg, "cpu").total_peak_bytes()
    status, words = _fit(cpu_need, host_free)
    data: dict[str, float | int | str | None] = {
        "preset": cfg.model.preset,
        "host_free_bytes": host_free,
        "cpu_need_bytes": cpu_need,
        "cpu_fits": status != "fail",
        "gpu_free_bytes": None,
        "gpu_need_bytes": None,
        "gpu_fits": None,
    }
    figure = f"{cpu_need / MiB:,.0f}/{host_free / MiB:,.0f} MiB"
    detail = f"{cfg.model.preset} on CPU: {words}"
    if cuda:
        gpu_free, _total = torch.cuda.mem_get_info()
        b = memory_budget(cfg, "cuda")
        dev_need, host_need = b.peak_bytes("device"), b.peak_bytes("host")
        g_status, g_words = _fit(dev_need, int(gpu_free))
        if host_need > host_free:
            g_status, g_words = "fail", "host side does not fit"
        data.update(gpu_free_bytes=int(gpu_free), gpu_need_bytes=dev_need, gpu_fits=g_status != "fail")
        detail += f"; on GPU: {g_words}"
        if g_status != "fail":
            figure = f"{dev_need / MiB:,.0f}/{int(gpu_free) / MiB:,.0f} MiB"
        order = {"ok": 0, "warn": 1, "fail": 2}
        status = min(status, g_status, key=lambda s: order[s])
    return Check("memory", status, figure, detail + " (need/free)", data)  # type: ignore[arg-type]
