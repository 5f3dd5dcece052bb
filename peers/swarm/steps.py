"""When a SWARM stage server applies its optimizer, and on which gradient.

SWARM (Ryabinin et al. 2023) trains synchronously: the servers of a stage accumulate the gradients
of the micro-batches routed to them and, once the trainers processed a step's global batch, combine
them and all apply the same step. :class:`StageSteps` is that bookkeeping for one server, without the
network (``peers.swarm.server`` feeds it requests, ``peers.swarm.replicas`` sums the gradients):

* ``closes = T >= 1``: micro-batch ``m`` belongs to step ``step_of(m, T, accumulate)``; the server
  takes a request only for the step it is at (:meth:`check`). The step is taken when all ``T``
  trainers closed it (:meth:`close`, each saying how many of its micro-batches of the step completed):
  ``step_sync`` turns the gradient sum this server accumulated into the stage's sum over its servers,
  and every replica steps its optimizer on that sum divided by the micro-batches the trainers
  completed (``None``: the round failed; the server then steps on its own mean). So they stay
  identical and follow one server that saw every micro-batch. The sum also counts its
  micro-batches (:data:`COUNT_KEY`): short of the trainers' count (a server holding some died),
  nobody steps and the trainers close the step again after feeding the lost ones once more (at
  most :data:`MAX_SHORT` times). A stage that already took the step answers such a micro-batch
  from its parameters after the step, without adding it again (:meth:`StageSteps.holds`). The
  counts come from the trainers and not from the collective's weighted mean: that one bounds each
  weight by twice the median (against members that inflate theirs), which would turn a 3:1 split
  of a step's micro-batches into 2:1.
* ``closes = 0``: the server steps alone after every ``accumulate`` backward passes.

A micro-batch's gradient counts once: :meth:`seen` tells the server that a backward it was asked for
again (a trainer's retry after a timeout) is already accumulated, so it answers the input gradient
without adding the parameters' gradients a second time.

**Catching up** (a server that joins a stage others serve, moved there by rebalancing, or found
behind): :meth:`start_syncing` makes the server follow the stage's steps without serving
micro-batches (:meth:`check` refuses them with ``busy``): it takes each step's closes and joins each
step's gradient round with zero gradients like any replica, but *logs* the stage's sums instead of
applying them. When a replica's snapshot of step ``w`` (parameters and optimizer state) arrives,
:meth:`adopt` replays the logged steps from ``w`` on, each exactly as the replicas applied it, and the
server is one of them again, bit for bit. A step it took without every trainer's close or without
the stage's round is logged as a gap; a snapshot older than a gap is refused (the caller fetches a
newer one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from peers.swarm.protocol import step_of
from swarmtrain.core.errors import ConfigError, ProtocolError

__all__ = ["StageSteps", "StepSync", "MAX_LOG"]

logger = logging.getLogger(__name__)

#: ``step_sync(step, expected_servers, grad_sums)`` -> the sum of ``grad_sums`` over the stage's
#: servers (each accumulated over the micro-batches it served), or ``None`` when the round failed
StepSync = Callable[[int, int, dict[str, torch.Tensor]], dict[str, torch.Tensor] | None]

#: steps a catching-up server logs at most (older ones are dropped: a snapshot must be newer)
MAX_LOG = 256
#: the entry of a step's gradient sums that counts the micro-batches in them (each server adds how
#: many it accumulated; not a parameter name: those hold dots or are plain attribute names)
COUNT_KEY = "#micro-batches"
#: sums of one step that may come up short (the trainers close it again after each); the next
#: close takes the step on what is there, so a stage never stalls on a micro-batch nobody can feed
MAX_SHORT = 2


class StageSteps:
    """One server's optimizer steps (see the module docstring). Not thread-safe: the server's worker
    calls it with the module's lock held.

    Args:
        module: the stage.
        optimizer: steps the module's parameters.
        closes: trainers that close each step (0: step alone every ``accumulate`` backward passes).
        accumulate: micro-batches each trainer feeds per step (``closes == 0``: backward passes per
            step).
        step_sync: sums the accumulated gradients with the stage's other servers'.
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
        self.short = 0  # closes whose sum lacked micro-batches the trainers completed (not taken)
        self.applied: set[int] = set()  # micro-batches whose gradients are accumulated since the step
        self.stepped_with: set[int] = set()  # ``applied`` of the last step taken
        self._shorts = 0  # sums of the current step short of micro-batches so far
        self.closers: dict[str, int] = {}  # trainers that closed the current step -> completed there
        self.expected = 1  # most servers of the stage a closing trainer saw
        #: a trainer asked for a later step than this server is at: it missed a step, its parameters
        #: are not the stage's (it leaves them out of the last average)
        self.behind = False
        self._backwards = 0
        #: following the stage's steps without serving, until :meth:`adopt` (see the module docstring)
        self.syncing = False
        #: while syncing: step -> (the stage's gradient sums, micro-batches completed), or ``None``
        #: for a step this server cannot replay
        self.log: dict[int, tuple[dict[str, torch.Tensor], int] | None] = {}
        self._known = True  # whether ``version`` is the stage's (a syncing server learns it from closes)

    def check(self, mb_id: int) -> None:
        """Refuse a micro-batch of another step than the one this server is at.

        Raises:
            ProtocolError: ``stale`` (the trainer reroutes it).
        """
        if self.syncing:
            raise ProtocolError("busy: catching up with the stage")
        if self.closes:
            step = step_of(mb_id, self.closes, self.accumulate)
            self.behind |= step > self.version
            if step == self.version - 1 and mb_id in self.stepped_with:
                return  # fed again for another stage that lost it: answered, not added (:meth:`seen`)
            if step != self.version:
                raise ProtocolError(f"stale: micro-batch {mb_id} is of step {step}, server at {self.version}")

    def holds(self, mb_id: int) -> bool:
        """Whether ``mb_id``'s gradients are in this server's coming step or in the step it just
        took: it answers that micro-batch again without adding it (a trainer's ``holds`` check)."""
        return mb_id in self.applied or mb_id in self.stepped_with

    def seen(self, mb_id: int) -> bool:
        """Whether ``mb_id``'s parameter gradients are already accumulated (counted as a duplicate)."""
        if self.holds(mb_id):
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

    def close(self, step: int, trainer: str, expected: int, completed: int) -> bool | None:
        """``trainer`` closed ``step`` (seeing ``expected`` servers of this stage; ``completed`` of its
        micro-batches of the step went through every stage). Returns ``None``
        when the step was already taken (a retried close), ``True`` when this close was the last one
        and the step is now taken, ``False`` when other trainers have yet to close it, or when the
        stage's sum was short (see :meth:`take`; no trainer's close is held any more then).

        Raises:
            ProtocolError: this server steps alone, or it is behind (it missed a step).
        """
        if not self.closes:
            raise ProtocolError("this server steps on its own (closes == 0)")
        if self.syncing and (not self._known or step > self.version):
            self._follow(step)
        if step < self.version:
            return None
        if step > self.version:
            self.behind = True
            raise ProtocolError(f"behind: at step {self.version}, asked to close step {step}")
        self.closers[trainer] = completed
        self.expected = max(self.expected, expected)
        if len(self.closers) < self.closes:
            return False
        return self.take()

    def take(self, complete: bool = True) -> bool:
        """Take the current step now, on the stage's gradient sum over the micro-batches the trainers
        completed (``complete=False``: not every trainer closed it; a syncing server logs a gap).

        Returns False, stepping nowhere, when the stage's sum holds fewer micro-batches than the
        trainers completed (:attr:`short`): a server that held some died in the meantime. The
        trainers feed those again and close the step once more (``peers.swarm.client``)."""
        params = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        sums = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in params}
        # on the gradients' device: the sum flattens every tensor into one vector
        dev = params[0][1].device if params else torch.device("cpu")
        sums[COUNT_KEY] = torch.tensor([float(len(self.applied))], device=dev)
        completed = sum(self.closers.values())
        logger.debug("stage %d step %d: micro-batches %s", self.stage, self.version, sorted(self.applied))
        got = self.step_sync(self.version, self.expected, sums) if self.step_sync is not None else sums
        if got is not None:
            got = dict(got)
            held = round(float(got.pop(COUNT_KEY).sum()))
            if held < completed and self._shorts < MAX_SHORT:  # every member sees the same count
                logger.warning(
                    "stage %d step %d: %d of the %d micro-batches completed are here; not stepping",
                    self.stage,
                    self.version,
                    held,
                    completed,
                )
                self.short += 1
                self._shorts += 1
                self.closers, self.expected = {}, 1
                return False
        del sums[COUNT_KEY]
        if self.syncing:
            self._log(got if complete else None, completed)
            return True
        if got is None:
            self.step_failures += 1
            logger.warning("stage %d: step %d on this server's gradients only", self.stage, self.version)
            got, completed = sums, len(self.applied)
        self._set_grads(got, completed)
        self._apply()
        return True

    def _set_grads(self, sums: dict[str, torch.Tensor], completed: int) -> None:
        for n, p in self.module.named_parameters():
            if p.requires_grad:
                p.grad = (sums[n] / completed).to(p.dtype) if completed else torch.zeros_like(p)

    # --- catching up ----------------------------------------------------------------------------------

    def start_syncing(self) -> None:
        """Follow the stage's steps without serving until :meth:`adopt` (the step number comes with
        the first close)."""
        self.syncing, self._known = True, False
        self.log = {}
        self.applied.clear()
        self.stepped_with.clear()
        self.closers, self.expected = {}, 1
        self.optimizer.zero_grad(set_to_none=True)

    def _follow(self, step: int) -> None:
        """A syncing server hears of ``step`` (ahead of what it follows): the steps in between are
        gaps, and it follows from ``step`` on."""
        if self._known:
            for missed in range(self.version, step):
                self.log[missed] = None
        self.version, self._known = step, True
        self.closers, self.expected = {}, 1

    def _log(self, sums: dict[str, torch.Tensor] | None, completed: int) -> None:
        entry = None
        if sums is not None and completed:
            entry = ({n: t.detach().clone() for n, t in sums.items()}, completed)
        self.log[self.version] = entry
        self.log = dict(sorted(self.log.items())[-MAX_LOG:])
        self.version += 1
        self.applied.clear()
        self._shorts = 0
        self.closers, self.expected = {}, 1

    @property
    def adoptable_from(self) -> int | None:
        """While syncing: the oldest step whose snapshot the log can bring to the current step
        (``None``: no step heard of yet)."""
        if not self.syncing or not self._known:
            return None
        step = self.version
        while self.log.get(step - 1) is not None:
            step -= 1
        return step

    def can_adopt(self, step: int) -> bool:
        """Whether a snapshot of ``step`` can be brought to the stage's current step from the log."""
        if not self.syncing or not self._known:
            return False
        if step >= self.version:
            return True
        return all(self.log.get(s) is not None for s in range(step, self.version))

    def adopt(self, step: int, load: Callable[[], None]) -> bool:
        """Take a replica's snapshot of ``step`` (``load`` copies its parameters and optimizer state
        into the module and optimizer) and replay the logged steps since; returns False (nothing
        changed) when the log cannot bridge it (see :meth:`can_adopt`)."""
        if not self.can_adopt(step):
            return False
        load()
        if step > self.version:  # the closes held so far were of an older step
            self.version = step
            self.closers, self.expected = {}, 1
        replay = [self.log.get(s) for s in range(step, self.version)]  # no gap: can_adopt
        for sums, completed in (e for e in replay if e is not None):
            self._set_grads(sums, completed)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.syncing = self.behind = False
        self.log = {}
        logger.info("stage %d: caught up at step %d from step %d's snapshot", self.stage, self.version, step)
        return True

    def _apply(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self.stepped_with, self.applied, self._shorts = self.applied, set(), 0
        self.closers, self.expected = {}, 1
