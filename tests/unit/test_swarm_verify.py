"""A trainer's replica checks of SWARM stage servers (``peers.swarm.verify``): what agrees, who is
the odd one out of three, which replies are checked, and that a check request adds no gradient on
the server that answers it (``peers.swarm.stage_compute``), so checking changes no step."""

from __future__ import annotations

import random

import pytest
import torch

from compression import build_compressor
from peers.swarm.protocol import (
    ACTIVATIONS,
    BACKWARD,
    FORWARD,
    GRADIENTS,
    StageLimits,
    decode_hidden,
    decode_loss,
    encode_hidden,
    encode_tokens,
)
from peers.swarm.stage_compute import Stage, compute
from peers.swarm.steps import StageSteps
from peers.swarm.verify import VERIFY, ReplicaCheck, agree, agree_loss, judge
from peers.wire.messages import Envelope
from swarmtrain.app.models.presets import GPTSpec
from swarmtrain.app.models.stages import build_stages
from swarmtrain.core.config import Config


def test_agreement_tolerates_float_noise_not_a_lie() -> None:
    torch.manual_seed(0)
    a = torch.randn(2, 8, 16)
    assert agree(a, a + 1e-6 * torch.randn_like(a))  # fp32 reordering between two processes
    assert not agree(a, -10 * a)  # finding 6's liar
    assert not agree(a, a * 1.2)
    assert not agree(a, a[:1])  # another shape
    assert agree_loss(2.7931, 2.7931 + 1e-6) and not agree_loss(2.79, 4.99)


def test_the_odd_one_of_three_is_named_and_a_tie_is_not() -> None:
    assert judge(True, True, True) is None
    assert judge(False, False, True) == "a"
    assert judge(False, True, False) == "b"
    assert judge(True, False, False) == "c"
    assert judge(False, False, False) == "all"


def test_first_reply_always_checked_then_a_sampled_share() -> None:
    rng = random.Random(1)
    check = ReplicaCheck(0.1)
    assert check.wants("A", rng)  # A's first reply
    check.checked_once("A")
    share = sum(check.wants("A", rng) for _ in range(10_000)) / 10_000
    assert 0.08 < share < 0.12
    off = ReplicaCheck(0.0)
    assert not off.on and not off.wants("B", rng)  # 0: no check at all, not even the first
    check.convict("A", "first reason")
    check.convict("A", "second reason")
    assert check.convicted == {"A": "first reason"}


def _stage(k: int, stages: list) -> Stage:  # type: ignore[type-arg]
    module = stages[k]
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    lim = StageLimits(k, len(stages), 32, 64, 16, 4)
    codec = build_compressor(Config().compression.model_copy(update={"codec": "none"}))
    return Stage(module, StageSteps(module, opt, closes=1), lim, codec, torch.device("cpu"))


def _grads(stage: Stage) -> float:
    return sum(float(p.grad.abs().sum()) for p in stage.module.parameters() if p.grad is not None)


def test_a_check_request_answers_the_same_and_adds_no_gradient() -> None:
    spec = GPTSpec(n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    stages = build_stages(spec, 3, seed=3)
    middle, last = _stage(1, stages), _stage(2, stages)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 32, generator=g)
    up = torch.randn(2, 16, 32, generator=g)
    y = torch.randint(0, 64, (2, 16), generator=g)
    codec = middle.compressor
    frames = [encode_hidden(x, codec), encode_hidden(up, codec)]

    def env(typ: str, kind: str, n: int, note: str = "") -> Envelope:
        return Envelope(type=typ, run="r", kind=kind, round=0, index=1, frames=n, nbytes=0, note=note)

    checked, _ = compute(middle, env(BACKWARD, GRADIENTS, 2, VERIFY), frames)
    assert _grads(middle) == 0.0 and not middle.steps.applied  # a check adds nothing
    real, _ = compute(middle, env(BACKWARD, GRADIENTS, 2), frames)
    assert _grads(middle) > 0 and middle.steps.applied == {0}
    lim = middle.limits
    assert agree(decode_hidden(checked.frames[0], lim), decode_hidden(real.frames[0], lim), 1e-6)
    assert middle.steps.duplicates == 0  # a check is not counted as a retried backward

    h = [encode_hidden(x, codec), encode_tokens(y)]
    checked, _ = compute(last, env(FORWARD, ACTIVATIONS, 2, VERIFY), h)
    assert _grads(last) == 0.0 and not last.steps.applied
    real, _ = compute(last, env(FORWARD, ACTIVATIONS, 2), h)
    assert _grads(last) > 0 and last.steps.applied == {0}
    assert decode_loss(checked.note) == decode_loss(real.note)


def test_parameters_travel_whole_and_checked() -> None:
    from peers.swarm import verify
    from swarmtrain.core.errors import ProtocolError

    flat = torch.arange(5000, dtype=torch.float32)
    old, verify.PARAMS_CHUNK = verify.PARAMS_CHUNK, 2048  # three frames
    try:
        frames = verify.params_frames(flat)
        assert len(frames) == 3
        assert torch.equal(verify.params_from_frames(frames, 5000), flat)
        for bad in (frames[:2], frames + frames[:1]):
            with pytest.raises(ProtocolError):
                verify.params_from_frames(bad, 5000)
        with pytest.raises(ProtocolError):
            verify.params_from_frames(verify.params_frames(flat * float("inf")), 5000)
    finally:
        verify.PARAMS_CHUNK = old


def test_a_requesters_parameter_downloads_are_budgeted() -> None:
    """A ``params`` request sends a stage's whole weights: one identity asking again and again is
    refused after its share per minute, others still served (``peers.swarm.server``)."""
    import asyncio
    import struct
    import threading

    from peers.swarm.protocol import PARAMS
    from peers.swarm.server import StageServer
    from peers.swarm.server_config import PARAMS_IN_ALL, PARAMS_PER_REQUESTER
    from peers.wire.budgets import RequesterBudget
    from peers.wire.messages import encode_envelope
    from swarmtrain.core.errors import ProtocolError

    class _Admitted:
        async def acheck(self, peer: str) -> bool:
            return True

    class _Node:
        run_id, admitted = "r", _Admitted()

    spec = GPTSpec(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32)
    server = object.__new__(StageServer)  # the request path only: no DHT node, no worker thread
    server.node, server.module, server._lock = _Node(), build_stages(spec, 2, seed=0)[0], threading.Lock()
    server.limits, server._draining, server._finishing = StageLimits(0, 2, 16, 32, 8, 4), False, False
    server.params_budget = RequesterBudget(PARAMS_PER_REQUESTER, PARAMS_IN_ALL)
    env = Envelope(type=FORWARD, run="r", kind=PARAMS, round=0, index=0, frames=0, nbytes=0)
    body = encode_envelope(env)

    async def ask(sender: str) -> bool:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", len(body)) + body)
        reader.feed_eof()
        try:
            await server._answer(sender, reader, type("X", (), {"received": 0, "kind_in": ""})())
        except ProtocolError as e:
            assert "too many parameter requests" in str(e)
            return False
        return True

    async def go() -> tuple[list[bool], bool]:
        mine = [await ask("greedy") for _ in range(PARAMS_PER_REQUESTER + 3)]
        return mine, await ask("honest")

    mine, other = asyncio.run(go())
    assert mine == [True] * PARAMS_PER_REQUESTER + [False] * 3
    assert other  # another requester keeps its share
