"""A lying SWARM stage server, for ``simulate --strategy swarm --byzantine-servers K``.

:func:`corrupt_stage_replies` makes the stage server of *this process* scale every hidden state it
sends back by ``factor`` (e.g. ``x(-10)``): a middle or first stage's activations,
and the last stage's gradient of its input (its only tensor reply). It computes, accumulates and
steps honestly: only what trainers receive is wrong, so its parameters stay identical to its
replicas' and nothing but a trainer's check of the replies can see it. It is installed in the server
child process before the server starts (``swarmtrain.simulation.swarm``), never in a real peer.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["corrupt_stage_replies", "FACTOR"]

#: what the lying server multiplies its replies by
FACTOR = -10.0


def corrupt_stage_replies(factor: float = FACTOR) -> None:
    """Scale every hidden state this process's stage server sends by ``factor`` (see the module
    docstring): activations of a forward, the last stage's input gradient. Not the gradients
    a middle stage's backward answers (``key="grad"`` there is left as is)."""
    from peers.swarm import stage_compute

    honest = stage_compute.encode_hidden
    inner = stage_compute._loss_and_backward
    _state = {"last": False}  # inside the last stage's reply (one worker thread computes)

    def lying(t: torch.Tensor, compressor: Any, key: str = "") -> bytes:
        bad = key == "act" or _state["last"]
        return honest(t * factor if bad else t, compressor, key=key)

    def loss_and_backward(*args: Any, **kwargs: Any) -> Any:
        _state["last"] = True
        try:
            return inner(*args, **kwargs)
        finally:
            _state["last"] = False

    stage_compute.encode_hidden = lying  # type: ignore[assignment]
    stage_compute._loss_and_backward = loss_and_backward  # type: ignore[assignment]
