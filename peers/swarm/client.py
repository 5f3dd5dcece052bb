"""The trainer's side of SWARM: send each micro-batch through one server per stage, reroute on failure.

For every request the pipeline draws a server of the stage (``peers.swarm.routing``: weighted by the
throughput and queue the servers announce), gives it a deadline from the measured service times of
that stage (``peers.swarm.deadlines``), and when the server refuses, errs, breaks the stream or
misses the deadline, excludes it for a while and sends the same request to another server of the
stage (``peers.swarm.tracker`` counts the reroute). A micro-batch is lost only when no server of a
stage answers within ``give_up_after`` seconds; it completes exactly once.

Forward: tokens to stage 0, each stage's output bytes forwarded unchanged to the next (no second
quantisation), targets with the last stage's input; the last stage answers the loss and the gradient
of its input. Backward: each earlier stage gets its input again with the gradient of its output and
answers the gradient of its input (it recomputes its forward: no state is kept on servers between
the two passes). The backward goes to the server that ran the forward while it answers (its
parameters made the activations the next stage differentiated); any other replica of the stage can
take it over when it fails. A request that adds gradients on its server (a backward, the last
stage's forward) and failed without a refusal is sent to the same server once more before another
one: it may have been applied there, and the server answers a micro-batch it already accumulated
without adding it again, where another replica would count it twice. Replies are untrusted: shapes
are checked against the request's.

Steps (:meth:`SwarmPipeline.close_step`): after its micro-batches of an optimizer step, a trainer
tells every server of every stage it sees that it closed the step, and waits until they answer that
the step is applied (``peers.swarm.server``: the replicas of a stage sum their gradients and
step together), so no micro-batch of the next step meets parameters of the last one. Before it
closes a step it asks each server that took gradients of its micro-batches whether it still holds
them (a ``holds`` request): a micro-batch whose gradients left with a dead server is fed again, its
gradient-adding requests going to the servers that still hold it on the other stages (they answer
without adding it twice), so the step still sums every micro-batch the trainer counts.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from peers.dht.node import PeerNode
from peers.swarm.cross_check import CrossCheck
from peers.swarm.deadlines import ServiceTimes
from peers.swarm.protocol import (
    ACTIVATIONS,
    BACKWARD,
    FORWARD,
    GRADIENTS,
    HOLDS,
    STEPS,
    StageLimits,
    decode_count,
    decode_hidden,
    decode_loss,
    encode_step_note,
    encode_tokens,
)
from peers.swarm.routing import ServerInfo, pick_server, server_from_record, servers_by_stage
from peers.swarm.stage_call import Refused, failure_reason, gather_steps, request
from peers.swarm.steps import MAX_SHORT
from peers.swarm.tracker import Exclusions, MicrobatchTracker
from peers.wire.messages import Envelope
from swarmtrain.core.errors import ConfigError, PeerTimeoutError, ProtocolError, SwarmError

__all__ = ["SwarmPipeline", "PipelineConfig", "NoServer"]

#: seconds a server has to say whether it holds a micro-batch's gradients (answered at once when up)
_HOLDS_TIMEOUT = 10.0
#: closes of one step at most: the servers take it on what is there after ``MAX_SHORT`` short sums
_CLOSE_TRIES = MAX_SHORT + 1

logger = logging.getLogger(__name__)


class NoServer(PeerTimeoutError):
    """No server of a stage answered a micro-batch's request within ``give_up_after``."""


@dataclass(frozen=True)
class PipelineConfig:
    """How a trainer routes.

    Attributes:
        stages: number of stages.
        width: model width ``C`` (hidden states are ``[B, T, C]``).
        vocab: token IDs are in ``[0, vocab)``.
        max_len: the model's context.
        max_batch: most rows per micro-batch.
        give_up_after: seconds a request may go without any server of its stage answering.
        exclude_s: seconds a failed server is left out of routing.
        busy_exclude_s: seconds a server that answered ``busy`` is left out.
        refresh_s: seconds between two reads of the servers' records.
        first_contact: deadline of a request before service times of its stage are measured.
        step_timeout: seconds a closed step may take to be applied (the other trainers' closes and
            the stage's gradient rounds included).
        min_grace: seconds the other servers of a stage have to answer a step after its first one.
        verify_rate: share of replies checked on a second replica of their stage after each
            server's first (``peers.swarm.verify``; 0: no check at all).
    """

    stages: int
    width: int
    vocab: int
    max_len: int
    max_batch: int
    give_up_after: float = 120.0
    exclude_s: float = 30.0
    busy_exclude_s: float = 1.0
    refresh_s: float = 1.0
    first_contact: float = 60.0
    step_timeout: float = 300.0
    min_grace: float = 2.0
    verify_rate: float = 0.0

    def limits(self, stage: int) -> StageLimits:
        """The bounds of ``stage``'s messages."""
        return StageLimits(stage, self.stages, self.width, self.vocab, self.max_len, self.max_batch)


class SwarmPipeline:
    """Runs micro-batches through the stage servers of a run (see the module docstring).

    Args:
        node: this trainer's started node.
        config: routing settings.
        seed: seed of the routing draws.
        stage_factory: builds stage ``k``'s module (any parameters): the trainer's own copy, loaded
            with the disputed servers' parameters to settle a disagreement of two replicas when the
            stage has no third one (``None``: such a disagreement stays open).
    """

    def __init__(
        self,
        node: PeerNode,
        config: PipelineConfig,
        *,
        seed: int = 0,
        stage_factory: Callable[[int], torch.nn.Module] | None = None,
    ) -> None:
        if config.stages < 2:
            raise ConfigError("a SWARM pipeline needs >= 2 stages")
        self.node = node
        self.config = config
        self.rng = random.Random(seed)
        self.times = ServiceTimes(first_contact=config.first_contact)
        self.exclusions = Exclusions(config.exclude_s)
        self.tracker = MicrobatchTracker()
        self._servers: list[list[ServerInfo]] = [[] for _ in range(config.stages)]
        self._refreshed = -1e9
        #: this step's micro-batches until it closes: ID -> (who holds its gradients on each stage,
        #: its inputs and targets), to feed again one whose gradients left with a dead server
        self._held: dict[int, tuple[list[str], torch.Tensor, torch.Tensor]] = {}
        self.fed_again = 0  # micro-batches fed again (see :meth:`close_step`)
        self.cross = CrossCheck(self, config.verify_rate, stage_factory)  # replies checked again
        self.check = self.cross.state

    # --- directory ----------------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> list[list[ServerInfo]]:
        """The servers of each stage from the DHT (at most every ``refresh_s`` unless ``force``)."""
        now = time.monotonic()
        if not force and now - self._refreshed < self.config.refresh_s:
            return self._servers
        found: list[ServerInfo] = []
        for rec in self.node.live_peers(timeout=10.0):
            try:
                info = server_from_record(
                    rec.peer_id, rec.role, rec.throughput, rec.extra, self.config.stages
                )
            except ProtocolError as e:
                logger.info("skipping the record of %s: %s", rec.peer_id[:16], e)
                continue
            if info is not None:
                found.append(info)
        self._servers = servers_by_stage(found, self.config.stages)
        self._refreshed = now
        return self._servers

    def wait_for_servers(self, timeout: float) -> list[list[ServerInfo]]:
        """Block until every stage has a server.

        Raises:
            PeerTimeoutError: some stage had none after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            servers = self.refresh(force=True)
            if all(servers):
                return servers
            if time.monotonic() > deadline:
                empty = [i for i, s in enumerate(servers) if not s]
                raise PeerTimeoutError(f"no server for stages {empty} within {timeout:.0f} s")
            time.sleep(0.3)

    # --- one micro-batch ----------------------------------------------------------------------------

    def train_microbatch(
        self, mb_id: int, x: torch.Tensor, y: torch.Tensor, *, keep: Sequence[str] | None = None
    ) -> float:
        """Forward and backward of one micro-batch through the stages; returns its loss.

        Args:
            mb_id: the run-wide micro-batch ID (fed once).
            x: ``[B, T]`` token IDs; y: ``[B, T]`` next-token IDs.
            keep: feeding it again (:meth:`close_step`): per stage, the server that took its
                gradients the first time; its requests that add gradients go there first (a server
                that still holds them answers without adding them twice; a dead one fails, and
                another server of the stage adds them).

        Raises:
            NoServer: a stage had no answering server for ``give_up_after`` seconds (the micro-batch
                stays counted as lost).
        """
        if x.shape != y.shape or x.dim() != 2:
            raise ConfigError("inputs and targets must be [B, T] tensors of one shape")
        bt = (int(x.shape[0]), int(x.shape[1]))
        last = self.config.stages - 1
        pref: Sequence[str | None] = keep if keep is not None else [None] * self.config.stages
        if keep is None:
            self.tracker.start(mb_id)
        else:
            self.tracker.reopen(mb_id)
        inputs = [encode_tokens(x)]  # inputs[s]: the bytes stage s gets (forwarded unchanged)
        holders: list[str] = []  # the backward goes back to the server that ran the forward
        for s in range(last):
            req = [inputs[s]]
            first = self._call(s, FORWARD, req, mb_id, bt, prefer=pref[s])
            reply = self.cross.checked(s, FORWARD, req, mb_id, bt, first)
            inputs.append(reply[1][0])
            holders.append(reply[2])  # the honest replica's when the first one was convicted
        req = [inputs[last], encode_tokens(y)]
        head, frames, peer = self.cross.checked(
            last, FORWARD, req, mb_id, bt, self._call(last, FORWARD, req, mb_id, bt, prefer=pref[last])
        )
        holders.append(peer)
        loss = decode_loss(head.note)
        grad = frames[0]
        for s in range(last - 1, -1, -1):
            req = [inputs[s], grad]
            _, frames, holders[s] = self.cross.checked(
                s, BACKWARD, req, mb_id, bt, self._call(s, BACKWARD, req, mb_id, bt, prefer=holders[s])
            )
            if s:
                grad = frames[0]
        self._held[mb_id] = (holders, x, y)
        self.tracker.complete(mb_id, bt[0], again=keep is not None)
        return loss

    def _feed_lost_again(self) -> None:
        """Ask the servers that took this step's micro-batches' gradients whether they still hold
        them; feed again each micro-batch whose gradients a server took with it when it died (or
        dropped when it fell behind), so the step sums every micro-batch the trainer counts."""
        asks = [(mb, s, p) for mb, (hs, _, _) in self._held.items() for s, p in enumerate(hs)]
        answers: list[bool] = self.node.loop.run(self._ask_holds(asks), _HOLDS_TIMEOUT + 5.0)
        lost: dict[int, list[int]] = {}
        for (mb, s, _), held in zip(asks, answers, strict=True):
            if not held:
                lost.setdefault(mb, []).append(s)
        for mb, gone in lost.items():
            logger.warning(
                "micro-batch %d: its gradients on stage(s) %s are gone; feeding it again", mb, gone
            )
            holders, x, y = self._held[mb]
            try:  # each request that adds gradients goes to the old holder first: one that still
                # holds them (a lost answer, not a lost server) answers without adding them twice
                self.train_microbatch(mb, x, y, keep=holders)
                self.fed_again += 1
            except NoServer as e:
                logger.warning("micro-batch %d: could not feed it again: %s", mb, e)

    async def _ask_holds(self, asks: list[tuple[int, int, str]]) -> list[bool]:
        return list(await asyncio.gather(*(self._holds(p, s, mb) for mb, s, p in asks)))

    async def _holds(self, peer: str, stage: int, mb_id: int) -> bool:
        env = Envelope(
            type=FORWARD, run=self.node.run_id, kind=HOLDS, round=mb_id, index=stage, frames=0, nbytes=0
        )
        for attempt in range(2):  # a broken stream is asked again; a dead server fails fast twice
            try:
                head, _ = await self._request(peer, env, [], _HOLDS_TIMEOUT)
                return decode_count(head.note) == 1
            except Refused as e:  # leaving: its gradients will not be in the step
                logger.info("stage %d server %s refused a holds check: %s", stage, peer[:16], e)
                return False
            except (SwarmError, TimeoutError) as e:
                logger.info("stage %d server %s: no answer on micro-batch %d: %s", stage, peer[:16], mb_id, e)
                if attempt == 0:
                    await asyncio.sleep(0.2)
        return False

    def close_step(self, step: int, completed: int) -> int:
        """Tell every server of every stage that this trainer fed all its micro-batches of ``step``
        (``completed`` of them went through every stage); returns once they applied the step.

        First, micro-batches whose gradients left with a dead server are fed again (each holder is
        asked). The servers of a stage take the step in one round, so once one of them answered,
        the others answer within moments or not at all (a dead server whose record has not expired
        yet, one that missed the round): those are left after a grace of the time the first answer
        took (at least ``min_grace`` s). A stage whose servers answer without taking the step summed
        fewer micro-batches than the trainers completed (a holder died during the close): the
        trainer checks and feeds again, and closes once more (up to :data:`_CLOSE_TRIES` times).
        Returns how many servers took the step."""
        took = 0
        for _ in range(_CLOSE_TRIES):
            self._feed_lost_again()
            took, short = self._close_once(step, completed)
            if not short:
                break
            logger.warning("step %d: stage(s) %s did not take it; closing it again", step, short)
        self._held.clear()
        return took

    def _close_once(self, step: int, completed: int) -> tuple[int, list[int]]:
        """One close of ``step``: how many servers took it, and the stages whose servers all
        answered without taking it."""
        servers = self.refresh(force=True)
        calls: list[tuple[int, str, Any]] = []
        for stage, group in enumerate(servers):
            env = Envelope(
                type=FORWARD,  # of kind STEPS, without frames: a step request
                run=self.node.run_id,
                kind=STEPS,
                round=step,
                index=stage,
                frames=0,
                nbytes=0,
                note=encode_step_note(max(1, len(group)), completed),
            )
            for srv in group:
                req = self._request(srv.peer_id, env, [], self.config.step_timeout)
                calls.append((stage, srv.peer_id, req))
        steps = gather_steps(calls, self.config.step_timeout, self.config.min_grace)
        results = self.node.loop.run(steps, self.config.step_timeout + 5.0)
        took, answered = [0] * self.config.stages, [0] * self.config.stages
        for (stage, peer, _), res in zip(calls, results, strict=True):
            if isinstance(res, BaseException):
                logger.info("stage %d server %s did not take step %d: %s", stage, peer[:16], step, res)
                continue
            try:
                took[stage] += int(decode_count(res[0].note) > step)
                answered[stage] += 1
            except ProtocolError as e:
                logger.info("stage %d server %s answered step %d oddly: %s", stage, peer[:16], step, e)
        return sum(took), [s for s in range(self.config.stages) if answered[s] and not took[s]]

    def _check_reply(
        self, stage: int, typ: str, head: Envelope, frames: list[bytes], bt: tuple[int, int]
    ) -> None:
        want = 0 if (typ == BACKWARD and stage == 0) else 1
        if len(frames) != want:
            raise ProtocolError(f"stage {stage} answered {len(frames)} frames, expected {want}")
        if want:  # a hidden state or a gradient of the request's shape
            decode_hidden(frames[0], self.config.limits(stage), expect=bt)

    def _call(
        self,
        stage: int,
        typ: str,
        frames: Sequence[bytes],
        mb_id: int,
        bt: tuple[int, int],
        prefer: str | None = None,
    ) -> tuple[Envelope, list[bytes], str]:
        """One request to a server of ``stage`` (``prefer``'s first while it is listed and not
        excluded: its parameters produced the activations this backward differentiates), rerouted
        until one answers; returns the reply and who served it."""
        kind = GRADIENTS if typ == BACKWARD else ACTIVATIONS
        env = Envelope(
            type=typ,
            run=self.node.run_id,
            kind=kind,
            round=mb_id,
            index=stage,
            frames=len(frames),
            nbytes=sum(len(f) for f in frames),
        )
        give_up = time.monotonic() + self.config.give_up_after
        # a request that adds gradients on the server (a backward, the last stage's forward) which
        # failed without a refusal may have been applied there: it goes to that server once more
        # (which answers without adding them again) before any other replica would add them twice
        accumulates = typ == BACKWARD or stage == self.config.stages - 1
        asked_again: set[str] = set()
        again: str | None = None
        while True:
            srv = self._pick(stage, again or prefer)
            again = None
            if srv is None:
                if time.monotonic() > give_up:
                    raise NoServer(
                        f"no server of stage {stage} answered for {self.config.give_up_after:.0f} s"
                    )
                time.sleep(0.2)
                self.refresh(force=True)
                continue
            timeout = self.times.deadline(stage, typ, srv.queue)
            t0 = time.monotonic()
            try:
                head, got = self.node.loop.run(
                    self._request(srv.peer_id, env, frames, timeout), timeout + 1.0
                )
                self._check_reply(stage, typ, head, got, bt)
            except (SwarmError, TimeoutError) as e:
                retry = accumulates and srv.peer_id not in asked_again
                again = self._failed(stage, typ, mb_id, srv.peer_id, timeout, e, may_retry=retry)
                if again is not None:
                    asked_again.add(again)
                continue
            self.times.record(stage, typ, time.monotonic() - t0)
            return head, got, srv.peer_id

    def _pick(self, stage: int, want: str | None) -> ServerInfo | None:
        """``want`` while it serves ``stage`` and is not excluded, else a weighted draw (``None``: none)."""
        servers = self.refresh()[stage]
        excluded = self.exclusions.active(time.monotonic()) | frozenset(self.check.convicted)
        mine = [x for x in servers if x.peer_id == want and x.peer_id not in excluded]
        return mine[0] if mine else pick_server(servers, excluded, self.rng)

    def _failed(
        self,
        stage: int,
        typ: str,
        mb_id: int,
        peer: str,
        timeout: float,
        e: BaseException,
        *,
        may_retry: bool,
    ) -> str | None:
        """Count a failed request; ``peer`` when the request goes to it once more (it failed without a
        refusal and may have added the gradients there), else ``None`` with ``peer`` excluded a while."""
        if isinstance(e, PeerTimeoutError):
            self.times.record(stage, typ, timeout)
        self.tracker.reroute(mb_id, failure_reason(e))
        again = may_retry and not isinstance(e, Refused)
        if not again:
            busy = isinstance(e, Refused) and "busy" in str(e)
            ttl = self.config.busy_exclude_s if busy else self.config.exclude_s
            self.exclusions.exclude(peer, time.monotonic(), ttl=ttl)
        what = "asking again" if again else "rerouting"
        logger.info(
            "stage %d %s of micro-batch %d on %s failed, %s: %s", stage, typ, mb_id, peer[:16], what, e
        )
        return peer if again else None

    async def _request(
        self,
        peer_id: str,
        env: Envelope,
        frames: Sequence[bytes],
        timeout: float,
        max_reply: int | None = None,
    ) -> tuple[Envelope, list[bytes]]:
        """One request to a server of stage ``env.index`` (``peers.swarm.stage_call.request``); the
        reply is bounded by the stage's packet cap, or ``max_reply`` bytes."""
        max_packet = self.config.limits(env.index).max_packet if max_reply is None else max_reply
        return await request(self.node, peer_id, env, frames, timeout, max_packet)
