"""When a SWARM stage server applies its optimizer, and on which gradient.

SWARM (Ryabinin et al. 2023) trains synchronously: the servers of a stage accumulate the gradients
of the micro-batches routed to them and, once the trainers processed a step's global batch, average
them and all apply the same step. :class:`StageSteps` is that bookkeeping for one server, without the
network (``peers.swarm.server`` feeds it requests, ``peers.swarm.replicas`` averages the gradients):

* ``closes = T >= 1``: micro-batch ``m`` belongs to step ``step_of(m, T, accumulate)``; the server
  takes a request only for the step it is at (:meth:`check`). The step is taken when all ``T``
  trainers closed it (:meth:`close`): the server's mean gradient over the micro-batches it served and
  their count go to ``step_sync``, which returns the stage's mean weighted by those counts (``None``:
  the round failed; the server then steps on its own mean). Every replica steps its optimizer on the
  same mean, so they stay identical and follow one server that saw every micro-batch.
* ``closes = 0``: the server steps alone after every ``accumulate`` backward passes.

A micro-batch's gradient counts once: :meth:`seen` tells the server that a backward it was asked for
again (a trainer's retry after a timeout) is already accumulated, so it answers the input gradient
without adding the parameters' gradients a second time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from peers.swarm.protocol import step_of
from swarmtrain.core.errors import ConfigError, ProtocolError

__all__ = ["StageSteps", "StepSync"]

logger = logging.getLogger(__name__)

#: ``step_sync(step, expected_servers, mean_grads, weight)`` -> the stage's weighted mean gradients, or
#: ``None`` when the stage's round failed
StepSync = Callable[[int, int, dict[str, torch.Tensor], float], dict[str, torch.Tensor] | None]


class StageSteps:
    """One server's optimizer steps (see the module docstring). Not thread-safe: the server's worker
    calls it with the module's lock held.

    Args:
        module: the stage.
        optimizer: steps the module's parameters.
        closes: trainers that close each step (0: step alone every ``accumulate`` backward passes).
        accumulate: micro-batches each trainer feeds per step (``closes == 0``: backward passes per
            step).
        step_sync: averages the accumulated gradients with the stage's other servers.
        stage: for log lines.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        closes: int = 0,
        accumulate: int = 1,
        step_sync: StepSync | None = None,
        stage: int = 0,
    ) -> None:
        if closes < 0 or accumulate < 1:
            raise ConfigError("need closes >= 0 and accumulate >= 1")
        self.module = module
        self.optimizer = optimizer
        self.closes = closes
        self.accumulate = accumulate
        self.step_sync = step_sync
        self.stage = stage
        self.version = 0  # optimizer steps taken
        self.duplicates = 0  # backwards of a micro-batch already accumulated
        self.step_failures = 0  # steps taken on this server's own gradients (the stage's round failed)
        self.applied: set[int] = set()  # micro-batches whose gradients are accumulated since the step
        self.closers: set[str] = set()  # trainers that closed the current step
        self.expected = 1  # most servers of the stage a closing trainer saw
        #: a trainer asked for a later step than this server is at: it missed a step, its parameters
        #: are not the stage's (it leaves them out of the last average)
        self.behind = False
        self._backwards = 0

    def check(self, mb_id: int) -> None:
        """Refuse a micro-batch of another step than the one this server is at.

        Raises:
            ProtocolError: ``stale`` (the trainer reroutes it).
        """
        if self.closes:
            step = step_of(mb_id, self.closes, self.accumulate)
            self.behind |= step > self.version
            if step != self.version:
                raise ProtocolError(f"stale: micro-batch {mb_id} is of step {step}, server at {self.version}")

    def seen(self, mb_id: int) -> bool:
        """Whether ``mb_id``'s parameter gradients are already accumulated (counted as a duplicate)."""
        if mb_id in self.applied:
            self.duplicates += 1
            logger.info("stage %d: micro-batch %d again: answered, not accumulated", self.stage, mb_id)
            return True
        return False

    def backward_done(self, mb_id: int) -> None:
        """``mb_id``'s gradients were added to the parameters' ``.grad``."""
        self.applied.add(mb_id)
        if self.closes:  # the step is taken when the trainers close it
            return
        self._backwards += 1
        if self._backwards % self.accumulate == 0:
            self._apply()

    def close(self, step: int, trainer: str, expected: int) -> bool | None:
        """``trainer`` closed ``step`` (seeing ``expected`` servers of this stage). Returns ``None``
        when the step was already taken (a retried close), ``True`` when this close was the last one
        and the step is now taken, ``False`` when other trainers have yet to close it.

        Raises:
            ProtocolError: this server steps alone, or it is behind (it missed a step).
        """
        if not self.closes:
            raise ProtocolError("this server steps on its own (closes == 0)")
        if step < self.version:
            return None
        if step > self.version:
            self.behind = True
            raise ProtocolError(f"behind: at step {self.version}, asked to close step {step}")
        self.closers.add(trainer)
        self.expected = max(self.expected, expected)
        if len(self.closers) < self.closes:
            return False
        self.take()
        return True

    def take(self) -> None:
        """Take the current step now: the stage's mean gradient of the micro-batches it served,
        weighted by micro-batch."""
        params = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        count = len(self.applied)
        mean = {n: p.grad / count if p.grad is not None and count else torch.zeros_like(p) for n, p in params}
        if self.step_sync is not None:
            got = self.step_sync(self.version, self.expected, mean, float(count))
            if got is None:
                self.step_failures += 1
                logger.warning("stage %d: step %d on this server's gradients only", self.stage, self.version)
            else:
                mean = got
        for n, p in params:
            p.grad = mean[n].to(p.dtype)
        self._apply()

    def _apply(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self.applied.clear()
        self.closers, self.expected = set(), 1
