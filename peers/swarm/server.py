"""A SWARM stage server: serves forward and backward of one pipeline stage to trainers.

The stream handler (on the node's event loop) checks admission and the bounded queue *before* it
reads a request's body, reads at most the stage's request cap (``StageLimits.max_request``), and
hands the raw frames to one worker thread, which decodes and validates them
(``peers.swarm.protocol``) and runs the stage. A full queue refuses at once with ``busy`` (the trainer
reroutes).

How the stage steps (``StageServerConfig.closes``):

* ``closes = T >= 1`` (what a SWARM run uses): the replicas of a stage take *one* optimization
  together, the one a single server that saw every micro-batch would take. Each accumulates the
  parameter gradients of the micro-batches it serves; micro-batch ``m`` belongs to step
  ``step_of(m, T, accumulate)``, and a server only serves micro-batches of the step it is at
  (``stale`` otherwise). When all ``T`` trainers closed the step (a step request), the stage's servers
  sum their accumulated gradients (``step_sync``: ``peers.swarm.replicas.ReplicaSync.sum_grads``, the
  run's collective, any codec), divide by the micro-batches the trainers completed, and every one
  applies the same optimizer step to the same parameters (``peers.swarm.steps``), so the replicas
  stay identical and follow the trajectory of one process stepping on the mean gradient of the step's
  micro-batches. A step a trainer never closes is taken ``close_timeout`` seconds after its first
  close.
* ``closes = 0``: each server steps alone after every ``accumulate`` backward passes (replicas drift
  apart until ``between_requests`` averages them).

A micro-batch's gradient counts once per server: a backward retried on a server that already applied
it (the trainer timed out and asked again) answers the input gradient without accumulating the
parameters' gradients again.

The server announces itself through its peer record (role ``server``): ``throughput`` (samples per
second it can serve whole micro-batches at: rows over the moving averages of its forward and backward
service times), and in ``extra`` its ``stage``, ``queue`` (requests waiting or running), ``ver``
(optimizer steps applied) and ``sync`` (catching up: :meth:`StageServer.catch_up`); the record's TTL
heartbeat removes a dead server. :meth:`StageServer.retire_after_step` stops it at a step boundary
(nothing of the next step accumulated) when it moves to another stage.

``device_s`` emulates a slower device: each micro-batch occupies the server at least that many
seconds (half on a forward, half on a backward; all on the last stage's one request), so
benchmarks and tests on one machine can give stages known, equal costs.
Bytes are counted where they cross the stream, under ``activations`` (forward) and ``gradients``
(backward) in the node's ledger, with the stage as the ledger's round.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from peers.dht.node import PeerNode
from peers.swarm.held_closes import HeldCloses, Job
from peers.swarm.protocol import (
    ACTIVATIONS,
    GRADIENTS,
    HOLDS,
    PARAMS,
    REPLY,
    STEPS,
    check_request,
    decode_step_note,
    encode_count,
    handler_name,
    is_holds,
    is_params,
    is_step,
)
from peers.swarm.server_config import PARAMS_IN_ALL, PARAMS_PER_REQUESTER, StageServerConfig, Stopper
from peers.swarm.stage_compute import Reply, ServiceRate, Stage, compute
from peers.swarm.steps import StageSteps, StepSync
from peers.swarm.verify import module_frames
from peers.wire.budgets import RequesterBudget
from peers.wire.messages import Envelope, decode_envelope, encode_ack, encode_envelope
from peers.wire.transport import read_data_frames, read_envelope, write_frame, write_frame_drained
from swarmtrain.core.errors import ProtocolError, SwarmError
from swarmtrain.core.protocols import Compressor

__all__ = [
    "StageServer",
    "StageServerConfig",
    "Stopper",
    "StepSync",
    "ACTIVATIONS",
    "GRADIENTS",
    "check_request",
]

logger = logging.getLogger(__name__)
_FRAME_TIMEOUT = 30.0
_JOB_TIMEOUT = 600.0


@dataclass
class _Exchange:
    """One stream's request and reply as counted: bytes and ledger kind each way, and whether it holds
    a place in the request queue (a micro-batch) or among the held step requests."""

    sent: int = 0
    received: int = 0
    kind_in: str = ACTIVATIONS
    kind_out: str = ACTIVATIONS
    counted: bool = False
    step_counted: bool = False


class StageServer:
    """Serves one stage module (see the module docstring).

    Args:
        node: the started node (created with role ``server``).
        module: the stage: ``module(x)`` -> ``[B, T, C]``; on the last stage ``module(x, targets)`` ->
            scalar loss.
        optimizer: steps the module's parameters.
        compressor: codec of the hidden states and gradients this server sends.
        config: limits and queue.
        between_requests: called by the worker when idle or after each request (replica sync).
        step_sync: sums the stage's accumulated gradients at each step (``closes >= 1``;
            ``None``: the server steps on its own gradients).
    """

    def __init__(
        self,
        node: PeerNode,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        compressor: Compressor,
        config: StageServerConfig,
        *,
        between_requests: Callable[[], object] | None = None,
        step_sync: StepSync | None = None,
    ) -> None:
        self.node = node
        self.module = module
        #: where the stage computes: decoded requests are moved here, replies encoded from here
        self.device = next(module.parameters()).device
        self.optimizer = optimizer
        self.compressor = compressor
        self.config = config
        self.limits = config.limits
        self.between_requests = between_requests
        self.steps = StageSteps(
            module,
            optimizer,
            closes=config.closes,
            accumulate=config.accumulate,
            step_sync=step_sync,
            stage=self.limits.stage,
        )
        self.served = 0  # requests answered
        self.refused = 0
        self.params_budget = RequesterBudget(PARAMS_PER_REQUESTER, PARAMS_IN_ALL)
        self._held = HeldCloses()  # step requests, answered once the step is taken (worker only)
        self._steps_open = 0  # step requests held (event loop only)
        self._rate = ServiceRate(self.limits.last)  # worker only
        self._stage = Stage(module, self.steps, self.limits, compressor, self.device)
        self.retired = threading.Event()  # set once it stopped at a step boundary to move
        self._retire = False
        self._draining = False  # set by stop(): refuse new requests, finish the queued ones
        self._finishing = False  # set by stop() first: refuse micro-batches, still take step closes
        self._inflight = 0  # event loop only
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the module between the worker and parameter readers
        self._handler = handler_name(node.run_id, self.limits.stage)
        node.loop.run(node.p2p.add_binary_stream_handler(self._handler, self._handle), 15.0)
        self._worker = threading.Thread(target=self._work, name="swarmtrain-stage", daemon=True)
        self._worker.start()
        self._announcer = threading.Thread(
            target=self._announce_loop, name="swarmtrain-stage-ann", daemon=True
        )
        self._announce()
        self._announcer.start()

    @property
    def version(self) -> int:
        """Optimizer steps taken."""
        return self.steps.version

    @property
    def throughput(self) -> float:
        """Samples per second of whole micro-batches (see the module docstring)."""
        return self._rate.throughput

    @property
    def duplicates(self) -> int:
        """Backwards of a micro-batch already accumulated here (answered, not accumulated again)."""
        return self.steps.duplicates

    @property
    def step_failures(self) -> int:
        """Steps taken on this server's own gradients (the stage's round failed)."""
        return self.steps.step_failures

    # --- announcing ---------------------------------------------------------------------------------

    def _announce(self) -> None:
        if self.retired.is_set():  # its record is the next stage's server's now
            return
        self.node.publish(
            role="server",
            throughput=self.throughput,
            stage=self.limits.stage,
            queue=self._inflight,
            ver=self.version,
            sync=int(self.steps.syncing),
        )

    def _announce_loop(self) -> None:
        while not self._stop.wait(self.config.announce_interval):
            self._announce()

    # --- receive side (event loop) --------------------------------------------------------------------

    async def _handle(self, info: Any, reader: Any, writer: Any) -> None:
        """One request on its own stream: answer it (or refuse it with a failed ack), count its bytes."""
        sender = str(info.peer_id.to_base58())
        x = _Exchange()
        try:
            try:
                env, reply = await self._answer(sender, reader, x)
            except ProtocolError as e:
                self.refused += 1
                logger.info("refused a stage request from %s: %s", sender[:16], e)
                x.sent += write_frame(writer, encode_ack(False, str(e)))
                await writer.drain()
                return
            x.kind_out = reply.kind
            await self._write_reply(writer, env, reply, x)
            self.served += 1
        except (SwarmError, ConnectionError, OSError, asyncio.TimeoutError) as e:
            logger.info("stage request from %s failed: %s", sender[:16], e)
        finally:
            if x.counted:
                self._inflight -= 1
            if x.step_counted:
                self._steps_open -= 1
            self.node.ledger.add_received(x.kind_in, self.limits.stage, x.received)
            self.node.ledger.add_sent(x.kind_out, self.limits.stage, x.sent)
            writer.close()

    async def _answer(self, sender: str, reader: Any, x: _Exchange) -> tuple[Envelope, Reply]:
        """Read and check a request, then its reply: a holds question at once, the rest from the worker.

        Raises:
            ProtocolError: refused (not admitted, busy, leaving, malformed, or the worker's refusal).
        """
        if not await self.node.admitted.acheck(sender):
            raise ProtocolError("not admitted to the run")
        if self._draining:
            raise ProtocolError("busy")
        body, n = await read_envelope(reader, _FRAME_TIMEOUT)
        x.received += n
        env = decode_envelope(body)
        check_request(env, self.limits, self.node.run_id)
        x.kind_in = env.kind
        loop = asyncio.get_running_loop()
        if self._finishing and not (is_step(env) or is_holds(env)):
            raise ProtocolError("busy: leaving")
        if is_holds(env):  # answered at once: only the worker changes ``applied``, atomically
            return env, Reply(HOLDS, [], encode_count(int(self.steps.holds(env.round))))
        if is_params(env):  # a trainer settling two replicas' disagreement (peers.swarm.verify)
            if not self.params_budget.take(sender, 1):
                raise ProtocolError("busy: too many parameter requests this minute")
            frames = await loop.run_in_executor(None, module_frames, self.module, self._lock)
            return env, Reply(PARAMS, frames)
        x.counted, x.step_counted = self._count_in(env)
        frames, n = await read_data_frames(
            reader, env, max_total=self.limits.max_request, timeout=_FRAME_TIMEOUT
        )
        x.received += n
        fut: asyncio.Future[Any] = loop.create_future()
        self._jobs.put(Job(env, frames, fut, loop, sender))
        return env, await asyncio.wait_for(fut, _JOB_TIMEOUT)

    async def _write_reply(self, writer: Any, env: Envelope, reply: Reply, x: _Exchange) -> None:
        """The ack, the reply's envelope and its frames, each counted as it is written."""
        head = Envelope(
            type=REPLY,
            run=self.node.run_id,
            kind=reply.kind,
            round=env.round,
            index=self.limits.stage,
            frames=len(reply.frames),
            nbytes=sum(len(f) for f in reply.frames),
            note=reply.note,
        )
        x.sent += write_frame(writer, encode_ack(True))
        x.sent += write_frame(writer, encode_envelope(head))
        for f in reply.frames:
            x.sent += await write_frame_drained(writer, f)
        await writer.drain()

    def _count_in(self, env: Envelope) -> tuple[bool, bool]:
        """Count a request in (``busy`` when too many of its kind are open): (a micro-batch, a step)."""
        if is_step(env):  # held until the step is applied: not in the request queue
            if self._steps_open >= self.config.max_queue:
                raise ProtocolError("busy")
            self._steps_open += 1
            return False, True
        if self._inflight >= self.config.max_queue:
            raise ProtocolError("busy")
        self._inflight += 1
        return True, False

    # --- worker thread ------------------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._jobs.get(timeout=0.2)
            except queue.Empty:
                self._idle()
                continue
            t0 = time.perf_counter()
            result: Any
            rows = 0
            try:
                with self._lock:
                    if is_step(job.env):
                        result = self._close(job)
                    else:
                        result, rows = compute(self._stage, job.env, job.frames)
                if not is_step(job.env):
                    self._emulate_device(t0)
            except ProtocolError as e:
                result = e
            except Exception as e:  # a bug must not kill the worker; the trainer reroutes
                logger.exception("stage %d failed a request", self.limits.stage)
                result = ProtocolError(f"server error: {type(e).__name__}")
            if result is None:  # a step request held until the other trainers close the step
                self._idle()
                continue
            job.answer(result)
            if isinstance(result, Reply) and not is_step(job.env):
                self._rate.measure(job.env.type, time.perf_counter() - t0, rows)
            self._idle()

    def _idle(self) -> None:
        if self._held.overdue(self.config.close_timeout):
            logger.warning(
                "stage %d: step %d closed by %d of %d trainers after %.0f s; taking it",
                self.limits.stage,
                self.version,
                len(self.steps.closers),
                self.config.closes,
                self.config.close_timeout,
            )
            with self._lock:
                taken = self.steps.take(complete=False)
                self._answer_closes()
                if taken:
                    self._stepped()
        if self.between_requests is not None and not self._stop.is_set():
            try:
                with self._lock:
                    self.between_requests()
            except Exception:  # the hook must not kill the worker: the stage would stop answering
                logger.exception("stage %d: the between-requests hook failed", self.limits.stage)

    def _emulate_device(self, t0: float) -> None:
        """Hold the worker until the request's share of ``device_s`` has passed since ``t0``."""
        share = self.config.device_s * (1.0 if self.limits.last else 0.5)
        left = share - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)

    # --- steps ----------------------------------------------------------------------------------------

    def _close(self, job: Job) -> Reply | None:
        """A trainer closed step ``job.env.round``: hold its request until every trainer did, then take
        the step and answer them all (``None``: held)."""
        taken = self.steps.close(job.env.round, job.sender, *decode_step_note(job.env.note))
        if taken is None:  # a retried close of a step already taken
            return Reply(STEPS, [], encode_count(self.version))
        if self._held.before(job.env.round):  # a catching-up server heard of a later step
            self._held.refuse("the stage went on")  # the held one is gone
        self._held.hold(job)
        if taken:
            self._answer_closes()
            self._stepped()
        elif not self.steps.closers:  # the stage's sum was short: no step; the trainers close again
            self._answer_closes()
        return None

    def _stepped(self) -> None:
        """A step was just taken: a server retiring to move stops here (refuses all that follows)."""
        if self._retire and not self.steps.syncing:
            self._draining = True
            self.retired.set()

    def _drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (self._inflight or not self._jobs.empty()) and time.monotonic() < end:
            time.sleep(0.05)

    def _answer_closes(self) -> None:
        self._held.answer(Reply(STEPS, [], encode_count(self.version)))

    # --- lifecycle ----------------------------------------------------------------------------------

    def state(self) -> dict[str, torch.Tensor]:
        """A copy of the stage's parameters (consistent: taken between requests)."""
        with self._lock:
            return {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def retire_after_step(self) -> None:
        """Stop serving right after the next step is taken (``retired`` is then set): from that
        moment every request is refused as ``busy`` and the record is no longer renewed, so the
        server can move to another stage without taking any of the next step's micro-batches."""
        self._retire = True

    def cancel_retire(self) -> bool:
        """Take back :meth:`retire_after_step`; False when the server retired already."""
        with self._lock:  # the worker retires under it
            self._retire = False
            return not self.retired.is_set()

    def catch_up(
        self,
        fetch: Callable[[int], tuple[int, Callable[[], None]]],
        stop: Stopper,
        wait: float = 0.2,
    ) -> bool:
        """Follow the stage's steps without serving until a replica's snapshot brings this server
        to the stage's step (``peers.swarm.steps``); blocking, call it from a thread.

        Args:
            fetch: ``fetch(step)`` -> ``(its step, load)``: a checked snapshot of ``step`` or later,
                and a function that loads it into the module and optimizer (called under the lock).
                Its errors are logged and it is called again.
            stop: give up once ``stop.wait(0)`` is true (a ``threading.Event``).
            wait: seconds between two checks while no step has been heard of yet.

        Returns:
            True once caught up; False when ``stop`` was set first.
        """
        with self._lock:
            self.steps.start_syncing()
        self._announce()
        while not stop.wait(0):
            with self._lock:
                since = self.steps.adoptable_from
            if since is None:
                stop.wait(wait)
                continue
            try:
                step, load = fetch(since)
            except (SwarmError, ProtocolError) as e:
                logger.info("stage %d: no snapshot to catch up from yet: %s", self.limits.stage, e)
                stop.wait(wait)
                continue
            with self._lock:
                done = self.steps.adopt(step, load)
                if done and self._held.before(self.version):
                    self._held.refuse("the stage went on")  # closes of a step before the snapshot
            if done:
                self._announce()
                return True
            logger.info("stage %d: step %d's snapshot is too old; again", self.limits.stage, step)
        return False

    def stop(self, timeout: float = 10.0, finish_step: float = 0.0) -> None:
        """Refuse new micro-batches, finish the queued ones, and (``finish_step`` > 0) when this
        server holds gradients of micro-batches of the current step, wait up to that many seconds
        for the trainers to close it: it joins the step's gradient round, where leaving at once
        would take those micro-batches out of the stage's step although the trainers count them.
        Then refuse everything, stop the worker, remove the handler."""
        if self._stop.is_set():
            return
        self._finishing = True
        self._drain(timeout)
        with self._lock:
            held, step = len(self.steps.applied) if self.config.closes else 0, self.version
        if held and finish_step > 0:
            logger.info(
                "stage %d: leaving after step %d (%d micro-batches here)", self.limits.stage, step, held
            )
            end = time.monotonic() + finish_step
            while self.version == step and time.monotonic() < end:
                time.sleep(0.05)
            if self.version == step:
                logger.warning(
                    "stage %d: step %d not closed in time; leaving without it", self.limits.stage, step
                )
        self._draining = True
        self._drain(timeout)
        self._stop.set()
        self._worker.join(timeout)
        self._announcer.join(timeout)
        self._held.refuse("the server is leaving")  # its trainers go on without this server
        try:
            self.node.loop.run(self.node.p2p.remove_binary_stream_handler(self._handler), 5.0)
        except Exception:
            logger.debug("removing the stage handler failed", exc_info=True)
