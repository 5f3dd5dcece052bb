"""The outer optimizer of DiLoCo and Streaming DiLoCo: SGD with (Nesterov) momentum on named tensors.

DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language Models")
treats the averaged pseudo-gradient ``anchor - local`` as a gradient of the anchor (global) parameters
and applies Nesterov SGD to it (paper defaults: lr 0.7, momentum 0.9). The update equals
``torch.optim.SGD(nesterov=True, dampening=0)`` bit for bit:

    buf <- g                      (first step)
    buf <- mu * buf + g           (later steps)
    d   <- g + mu * buf           (Nesterov)   or   d <- buf   (heavy ball)
    p   <- p - lr * d

It is written out here (rather than wrapping ``torch.optim.SGD``) so that its whole state is a flat
mapping of named tensors that a checkpoint or a newcomer's download can carry, and so that Streaming
DiLoCo can step one fragment's tensors at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from swarmtrain.core.errors import ConfigError

__all__ = ["OuterSGD", "saved_hyperparameters"]


class OuterSGD:
    """Nesterov/heavy-ball SGD over named tensors, stepped by name subsets.

    Args:
        lr: outer learning rate (> 0).
        momentum: momentum coefficient in ``[0, 1)``; 0 disables the buffer.
        nesterov: use the Nesterov look-ahead (ignored when ``momentum == 0``).
    """

    def __init__(self, lr: float, momentum: float, nesterov: bool) -> None:
        if not lr > 0:
            raise ConfigError(f"outer_lr must be > 0, got {lr}")
        if not 0 <= momentum < 1:
            raise ConfigError(f"outer_momentum must be in [0, 1), got {momentum}")
        self.lr = float(lr)
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov) and momentum > 0
        self.buffers: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def step(self, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor]) -> None:
        """Update ``params[name]`` in place with ``grads[name]`` for every name in ``grads``."""
        for name, g in grads.items():
            p = params[name]
            buf = self.buffers.get(name)
            if buf is not None and buf.device != p.device:  # restored from a CPU checkpoint
                buf = self.buffers[name] = buf.to(p.device)
            buf = self.update(p, buf, g)
            if buf is not None:
                self.buffers[name] = buf

    @torch.no_grad()
    def update(self, p: torch.Tensor, buf: torch.Tensor | None, g: torch.Tensor) -> torch.Tensor | None:
        """One tensor's step: ``p`` in place; returns its momentum buffer (``buf`` updated in place, a
        new one when ``buf`` is None, None without momentum). ``buf`` must be on ``p``'s device.

        ``optimizers.outer_store`` calls this one tensor at a time on tensors it brought to the device,
        so every place the outer state lives runs the same arithmetic.
        """
        g = g.to(p.dtype)
        if self.momentum > 0:
            if buf is None:
                buf = g.clone()
            else:
                buf.mul_(self.momentum).add_(g)
            d = g.add(buf, alpha=self.momentum) if self.nesterov else buf
        else:
            d = g
        p.add_(d, alpha=-self.lr)
        return buf if self.momentum > 0 else None

    def state_dict(self, names: Iterable[str] | None = None) -> dict[str, Any]:
        """Momentum buffers (cloned) and hyper-parameters, optionally only for ``names``."""
        keep = None if names is None else set(names)
        return {
            "lr": self.lr,
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "buffers": {k: v.clone() for k, v in self.buffers.items() if keep is None or k in keep},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore buffers and hyper-parameters from ``state_dict()`` output.

        Raises:
            ConfigError: hyper-parameters the constructor would refuse (the state may be a peer's).
        """
        self.lr, self.momentum, self.nesterov = saved_hyperparameters(state)
        self.buffers = {str(k): v.clone() for k, v in dict(state["buffers"]).items()}


def saved_hyperparameters(state: Mapping[str, Any]) -> tuple[float, float, bool]:
    """``(lr, momentum, nesterov)`` of a saved outer optimizer state, checked as the constructor
    checks its arguments: a donor's state with a NaN or negative learning rate or a momentum outside
    [0, 1) would wreck every later outer step.

    Raises:
        ConfigError: such values.
    """
    lr, momentum = float(state["lr"]), float(state["momentum"])
    if not (math.isfinite(lr) and lr > 0):
        raise ConfigError(f"outer state: lr must be finite and > 0, got {lr}")
    if not 0 <= momentum < 1:
        raise ConfigError(f"outer state: momentum must be in [0, 1), got {momentum}")
    return lr, momentum, bool(state["nesterov"]) and momentum > 0
