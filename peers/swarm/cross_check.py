"""A trainer's replica checks on the wire (``peers.swarm.verify`` has the rules): a sampled reply
sent again as a check to another replica of its stage, compared, and a disagreement settled by a
third replica or by the trainer's own copy of the stage loaded with the parameters both disputed
servers send (a ``params`` request). :class:`CrossCheck` is one :class:`peers.swarm.client.SwarmPipeline`'s.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from peers.swarm.protocol import (
    ACTIVATIONS,
    BACKWARD,
    FORWARD,
    GRADIENTS,
    PARAMS,
    decode_hidden,
    decode_loss,
    decode_tokens,
)
from peers.swarm.routing import pick_server
from peers.swarm.verify import VERIFY, ReplicaCheck, agree, agree_loss, judge, params_from_frames
from peers.wire.messages import Envelope
from swarmtrain.core.errors import SwarmError

__all__ = ["CrossCheck"]

logger = logging.getLogger(__name__)


class Pipe(Protocol):
    """What a check uses of its pipeline (``peers.swarm.client.SwarmPipeline``)."""

    rng: random.Random
    node: Any
    config: Any  # PipelineConfig
    times: Any  # ServiceTimes
    exclusions: Any  # Exclusions

    def refresh(self, force: bool = False) -> list[list[Any]]: ...

    async def _request(
        self,
        peer_id: str,
        env: Envelope,
        frames: Sequence[bytes],
        timeout: float,
        max_reply: int | None = None,
    ) -> tuple[Envelope, list[bytes]]: ...

    def _check_reply(
        self, stage: int, typ: str, head: Envelope, frames: list[bytes], bt: tuple[int, int]
    ) -> None: ...


class CrossCheck:
    """The replica checks of one trainer's pipeline.

    Args:
        pipe: the pipeline whose replies are checked (its node, routing and requests are used).
        rate: share of replies checked after each server's first (``ReplicaCheck``).
        stage_factory: builds stage ``k``'s module (any parameters): the trainer's own copy, loaded
            with the disputed servers' parameters to settle a disagreement of two replicas when the
            stage has no third one (``None``: such a disagreement stays open).
    """

    def __init__(
        self,
        pipe: Pipe,
        rate: float,
        stage_factory: Callable[[int], torch.nn.Module] | None = None,
    ) -> None:
        self.pipe = pipe
        self.state = ReplicaCheck(rate)
        self.stage_factory = stage_factory
        self._local: dict[int, torch.nn.Module] = {}  # stage -> this trainer's copy (built on need)

    def checked(
        self,
        stage: int,
        typ: str,
        frames: Sequence[bytes],
        mb_id: int,
        bt: tuple[int, int],
        reply: tuple[Envelope, list[bytes], str],
    ) -> tuple[Envelope, list[bytes], str]:
        """``reply`` (a server's answer to ``typ`` of ``mb_id`` on ``stage``), checked on another
        replica of the stage when :attr:`state` wants it; returns the reply to go on with: the
        majority's when a third replica convicted the first server. Its server is then the one that
        gave it, unless the request added gradients on the first server (a backward, the last
        stage's forward): that one holds them for the step."""
        head, got, peer = reply
        if (typ == BACKWARD and stage == 0) or not self.state.wants(peer, self.pipe.rng):
            return reply  # stage 0's backward answers nothing to compare
        other = self._verify_on(stage, typ, frames, mb_id, bt, {peer})
        if other is None:  # no other replica answered: nothing compared, nothing counted
            return reply
        self.state.checked_once(peer)
        if self._same(stage, typ, reply, other):
            return reply
        self.state.mismatches += 1
        third = self._verify_on(stage, typ, frames, mb_id, bt, {peer, other[2]})
        ref: tuple[float | None, torch.Tensor] | None
        if third is not None:
            ref, by = self._value(stage, typ, third), "two other replicas"
        else:  # no third replica: this trainer's own copy of the stage, if both send the same parameters
            ref, by = self._recompute(stage, typ, frames, peer, other[2]), "the stage's own parameters"
        if ref is None:
            self.state.disputes.append((stage, peer, other[2]))
            logger.warning(
                "stage %d: %s and %s disagree on micro-batch %d and nothing can tell which is right; "
                "neither is excluded",
                stage,
                peer[:16],
                other[2][:16],
                mb_id,
            )
            return reply
        va, vb = self._value(stage, typ, reply), self._value(stage, typ, other)
        odd = judge(False, _agrees(va, ref), _agrees(vb, ref))
        liar = {"a": peer, "b": other[2]}.get(odd or "all")
        if liar is None:  # the referee agrees with neither (or is itself the odd one)
            self.state.disputes.append((stage, peer, other[2]))
            logger.warning("stage %d: no majority on micro-batch %d", stage, mb_id)
            return reply
        why = f"stage {stage}: its {typ} of micro-batch {mb_id} disagreed with {by}"
        self.state.convict(liar, why)
        logger.warning("excluded server %s: %s", liar[:16], why)
        if liar != peer:
            return reply
        keeps = typ == BACKWARD or stage == self.pipe.config.stages - 1  # gradients added on ``peer``
        return (other[0], other[1], peer if keeps else other[2])

    def _verify_on(
        self,
        stage: int,
        typ: str,
        frames: Sequence[bytes],
        mb_id: int,
        bt: tuple[int, int],
        skip: set[str],
    ) -> tuple[Envelope, list[bytes], str] | None:
        """The same request as a check (nothing accumulated) on another replica of ``stage``, not
        one of ``skip``; ``None`` when none answered (two tries)."""
        kind = GRADIENTS if typ == BACKWARD else ACTIVATIONS
        env = Envelope(
            type=typ,
            run=self.pipe.node.run_id,
            kind=kind,
            round=mb_id,
            index=stage,
            frames=len(frames),
            nbytes=sum(len(f) for f in frames),
            note=VERIFY,
        )
        for _ in range(2):
            excluded = self.pipe.exclusions.active(time.monotonic()) | frozenset(self.state.convicted) | skip
            srv = pick_server(self.pipe.refresh()[stage], excluded, self.pipe.rng)
            if srv is None:
                return None
            timeout = self.pipe.times.deadline(stage, typ, srv.queue)
            try:
                head, got = self.pipe.node.loop.run(
                    self.pipe._request(srv.peer_id, env, frames, timeout), timeout + 1.0
                )
                self.pipe._check_reply(stage, typ, head, got, bt)
                if typ == FORWARD and stage == self.pipe.config.stages - 1:
                    decode_loss(head.note)  # a bad loss note is this server's failure, not the trainer's
            except (SwarmError, TimeoutError) as e:
                logger.info(
                    "stage %d: check of micro-batch %d on %s failed: %s", stage, mb_id, srv.peer_id[:16], e
                )
                skip = skip | {srv.peer_id}
                continue
            return head, got, srv.peer_id
        return None

    def _same(
        self,
        stage: int,
        typ: str,
        a: tuple[Envelope, list[bytes], str],
        b: tuple[Envelope, list[bytes], str],
    ) -> bool:
        """Whether two replicas' replies to one request agree (``peers.swarm.verify``)."""
        return _agrees(self._value(stage, typ, a), self._value(stage, typ, b))

    def _value(
        self, stage: int, typ: str, reply: tuple[Envelope, list[bytes], str]
    ) -> tuple[float | None, torch.Tensor]:
        """What a reply says: the last stage's loss (else ``None``) and its tensor."""
        loss = decode_loss(reply[0].note) if typ == FORWARD and stage == self.pipe.config.stages - 1 else None
        return loss, decode_hidden(reply[1][0], self.pipe.config.limits(stage))

    def _recompute(
        self, stage: int, typ: str, frames: Sequence[bytes], a: str, b: str
    ) -> tuple[float | None, torch.Tensor] | None:
        """The reply this trainer computes itself on its own copy of ``stage`` loaded with the
        parameters ``a`` and ``b`` both send (replicas hold the same bits); ``None`` when there is
        no copy, either does not answer, or their parameters differ."""
        if self.stage_factory is None:
            return None
        if stage not in self._local:
            self._local[stage] = self.stage_factory(stage).train()
        module = self._local[stage]
        numel = sum(p.numel() for p in module.parameters())
        got = [self._params(stage, peer, numel) for peer in (a, b)]
        if got[0] is None or got[1] is None or not torch.equal(got[0], got[1]):
            logger.warning("stage %d: the two replicas' parameters differ or did not come", stage)
            return None
        torch.nn.utils.vector_to_parameters(got[0], module.parameters())
        lim = self.pipe.config.limits(stage)
        x = decode_tokens(frames[0], lim) if stage == 0 else decode_hidden(frames[0], lim)
        if typ == FORWARD and stage < self.pipe.config.stages - 1:
            with torch.no_grad():
                return None, module(x).float()
        x.requires_grad_(True)
        if typ == FORWARD:  # the last stage: the loss and the gradient of its input
            loss = module(x, decode_tokens(frames[1], lim))
            (grad,) = torch.autograd.grad(loss, [x])
            return float(loss), grad
        (grad,) = torch.autograd.grad(module(x), [x], decode_hidden(frames[1], lim))
        return None, grad

    def _params(self, stage: int, peer: str, numel: int) -> torch.Tensor | None:
        """``peer``'s parameters of ``stage`` (``numel`` floats), or ``None`` when it did not send them."""
        env = Envelope(
            type=FORWARD, run=self.pipe.node.run_id, kind=PARAMS, round=0, index=stage, frames=0, nbytes=0
        )
        cap = 4 * numel + 4096 * (numel // (1 << 20) + 2)
        try:
            wait = self.pipe.config.first_contact
            _, got = self.pipe.node.loop.run(self.pipe._request(peer, env, [], wait, cap), wait + 1.0)
            return params_from_frames(got, numel)
        except (SwarmError, TimeoutError) as e:
            logger.info("stage %d server %s sent no parameters: %s", stage, peer[:16], e)
            return None


def _agrees(a: tuple[float | None, torch.Tensor], b: tuple[float | None, torch.Tensor]) -> bool:
    """Whether two replies' values (loss or ``None``, tensor) agree (``peers.swarm.verify``)."""
    if a[0] is not None and b[0] is not None and not agree_loss(a[0], b[0]):
        return False
    return agree(a[1], b[1])
