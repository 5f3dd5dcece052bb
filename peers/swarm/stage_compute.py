"""What a stage server computes for one request, apart from how requests reach it (``peers.swarm.server``).

* :func:`compute`: a decoded forward or backward request of one micro-batch run through the stage
  module, with its gradients accumulated once per micro-batch (``peers.swarm.steps``): a backward
  retried on a server that already accumulated it answers the input gradient only, and so does a
  trainer's replica check (``note`` :data:`peers.swarm.verify.VERIFY`).
* :class:`ServiceRate`: the samples per second the server announces (rows over the moving averages of
  its forward and backward service times), which trainers route by (``peers.swarm.routing``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from peers.swarm.protocol import (
    ACTIVATIONS,
    BACKWARD,
    FORWARD,
    GRADIENTS,
    StageLimits,
    decode_hidden,
    decode_tokens,
    encode_hidden,
    encode_loss,
)
from peers.swarm.steps import StageSteps
from peers.swarm.verify import VERIFY
from peers.wire.messages import Envelope
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.protocols import Compressor

__all__ = ["Reply", "ServiceRate", "compute"]


@dataclass(frozen=True)
class Reply:
    """A request's answer: its ledger kind, the frames sent back and the reply envelope's note."""

    kind: str
    frames: list[bytes]
    note: str = ""


@dataclass
class Stage:
    """What :func:`compute` runs a request on: the module, its step bookkeeping, its limits, the codec
    of the replies and the device the module lives on."""

    module: nn.Module
    steps: StageSteps
    limits: StageLimits
    compressor: Compressor
    device: torch.device


def compute(stage: Stage, env: Envelope, frames: list[bytes]) -> tuple[Reply, int]:
    """Run one checked request (``FORWARD`` or ``BACKWARD``) on the stage; the reply and its rows.

    Raises:
        ProtocolError: a request of another step, or inputs and targets of different shapes.
    """
    lim = stage.limits
    stage.steps.check(env.round)
    x = decode_tokens(frames[0], lim) if lim.first else decode_hidden(frames[0], lim)
    x = x.to(stage.device)  # decoded on the host, computed on the stage's device
    bt = (int(x.shape[0]), int(x.shape[1]))
    again = env.type != FORWARD or lim.last
    # a replica check (``peers.swarm.verify``) computes the reply without accumulating anything;
    # otherwise a micro-batch whose gradients are already accumulated here is answered, not added
    again = again and (env.note == VERIFY or stage.steps.seen(env.round))
    if env.type == FORWARD and not lim.last:
        with torch.no_grad():
            y = stage.module(x)
        return Reply(ACTIVATIONS, [encode_hidden(y, stage.compressor, key="act")]), bt[0]
    if env.type == FORWARD:  # last stage: forward, loss and backward in one request
        return _loss_and_backward(stage, env, frames, x, again), bt[0]
    return _backward(stage, env, decode_hidden(frames[1], lim, expect=bt), x, again), bt[0]


def _loss_and_backward(
    stage: Stage, env: Envelope, frames: list[bytes], x: torch.Tensor, again: bool
) -> Reply:
    """The last stage: the loss on the micro-batch's targets and the gradient of its inputs."""
    targets = decode_tokens(frames[1], stage.limits).to(stage.device)
    if tuple(targets.shape) != tuple(x.shape[:2]):
        raise ProtocolError(f"targets are {list(targets.shape)}, inputs {list(x.shape[:2])}")
    x.requires_grad_(True)
    loss = stage.module(x, targets)
    if again:
        (grad,) = torch.autograd.grad(loss, [x])
    else:
        loss.backward()
        stage.steps.backward_done(env.round)
        grad = x.grad if x.grad is not None else torch.zeros_like(x)
    return Reply(GRADIENTS, [encode_hidden(grad, stage.compressor, key="grad")], encode_loss(loss.item()))


def _backward(stage: Stage, env: Envelope, g: torch.Tensor, x: torch.Tensor, again: bool) -> Reply:
    """A middle or first stage: the forward again, then the backward of the output gradient ``g``."""
    first = stage.limits.first
    g = g.to(stage.device)
    if again and first:
        return Reply(GRADIENTS, [])
    if not first:
        x.requires_grad_(True)
    y = stage.module(x)
    if again:
        (grad,) = torch.autograd.grad(y, [x], g)
        return Reply(GRADIENTS, [encode_hidden(grad, stage.compressor, key="grad")])
    y.backward(g)
    stage.steps.backward_done(env.round)
    if first:
        return Reply(GRADIENTS, [])
    grad = x.grad if x.grad is not None else torch.zeros_like(x)
    return Reply(GRADIENTS, [encode_hidden(grad, stage.compressor, key="grad")])


class ServiceRate:
    """Samples per second of whole micro-batches: rows over the moving averages (EWMA, 0.2) of the
    service times of a forward and a backward (the last stage's one forward request does both)."""

    def __init__(self, last_stage: bool) -> None:
        self.kinds = (FORWARD,) if last_stage else (FORWARD, BACKWARD)
        self.throughput = 0.0
        self._service: dict[str, float] = {}  # request type -> seconds per request (EWMA)
        self._rows_avg = 0.0

    def measure(self, kind: str, seconds: float, rows: int) -> None:
        """A request of ``kind`` over ``rows`` rows took ``seconds``."""
        old = self._service.get(kind)
        self._service[kind] = seconds if old is None else 0.8 * old + 0.2 * seconds
        self._rows_avg = rows if self._rows_avg == 0 else 0.8 * self._rows_avg + 0.2 * rows
        if all(k in self._service for k in self.kinds):
            self.throughput = self._rows_avg / max(sum(self._service[k] for k in self.kinds), 1e-6)
