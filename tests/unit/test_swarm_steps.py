"""SWARM stage steps: replicas that split a step's micro-batches unevenly and sum their gradients take
exactly the step of one server that saw them all; a gradient counts once; a server serves only the
step it is at."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from torch import nn

from peers.swarm.protocol import (
    FORWARD,
    STEPS,
    StageLimits,
    decode_count,
    decode_step_note,
    encode_count,
    encode_step_note,
    step_of,
)
from peers.swarm.server import check_request
from peers.swarm.steps import COUNT_KEY, StageSteps, StepSync
from peers.wire.messages import Envelope
from swarmtrain.core.errors import ProtocolError


def _model() -> nn.Module:
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _opt(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)


def _loss(m: nn.Module, mb: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + mb)
    x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
    return ((m(x) - y) ** 2).mean()


class _Stage:
    """The stage's collective in one process: every replica's ``step_sync`` meets the others' and
    gets the sum of their gradient sums."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n)
        self.rows: dict[int, dict[str, torch.Tensor]] = {}

    def member(self, who: int) -> StepSync:
        def sync(step: int, expected: int, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            self.rows[who] = {k: v.clone() for k, v in grads.items()}
            self.barrier.wait()
            out = {k: sum(g[k] for g in self.rows.values()) for k in grads}
            self.barrier.wait()
            return out

        return sync


def test_replicas_that_split_micro_batches_step_like_one_server() -> None:
    per_step, steps, n = 3, 6, 3
    stage = _Stage(n)
    replicas = [_model() for _ in range(n)]
    books = [
        StageSteps(m, _opt(m), closes=1, accumulate=per_step, step_sync=stage.member(i))
        for i, m in enumerate(replicas)
    ]
    ref = _model()
    ref_opt = _opt(ref)
    rng = random.Random(0)
    for step in range(steps):
        mbs = list(range(step * per_step, (step + 1) * per_step))
        for mb in mbs:  # routed to a random replica: 3:0:0 splits, 2:1:0 ...
            who = rng.randrange(n) if step % 2 else 0
            books[who].check(mb)
            assert not books[who].seen(mb)
            _loss(replicas[who], mb).backward()
            books[who].backward_done(mb)
            (_loss(ref, mb) / len(mbs)).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        threads = [threading.Thread(target=b.close, args=(step, "trainer0", n, len(mbs))) for b in books]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [b.version for b in books] == [step + 1] * n
    for m in replicas[1:]:  # bit-identical replicas ...
        for a, b in zip(replicas[0].parameters(), m.parameters(), strict=True):
            assert torch.equal(a, b)
    for a, b in zip(replicas[0].parameters(), ref.parameters(), strict=True):  # ... on one trajectory
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_retried_backward_counts_once() -> None:
    m = _model()
    book = StageSteps(m, _opt(m), closes=1, accumulate=2)
    _loss(m, 0).backward()
    book.backward_done(0)
    assert book.seen(0) and book.duplicates == 1  # the server answers it without accumulating
    assert not book.seen(1)
    assert book.close(0, "t", 1, 1) is True and book.version == 1
    assert book.applied == set()  # a new step starts with nothing accumulated
    # a micro-batch of the step just taken, fed again because another stage lost it: answered
    # (from the parameters after the step), never added to the new step
    book.check(0)
    assert book.holds(0) and book.seen(0) and book.applied == set()
    assert not book.holds(1)


def test_a_server_serves_only_its_step_and_waits_for_every_trainer() -> None:
    m = _model()
    book = StageSteps(m, _opt(m), closes=2, accumulate=2)  # step = (mb // 2 trainers) // 2
    book.check(3)
    assert not book.behind
    with pytest.raises(ProtocolError, match="stale"):
        book.check(4)
    assert book.behind  # it missed a step: left out of the stage's last average
    for mb in range(3):  # step 0's micro-batches 0-2 here (3 went to another server)
        book.backward_done(mb)
    assert book.close(0, "a", 2, 2) is False
    assert book.close(0, "a", 2, 2) is False  # the same trainer twice is one close
    assert book.close(0, "b", 2, 1) is True and book.version == 1  # b's second was lost
    assert book.close(0, "b", 2, 1) is None  # a retried close of a step already taken
    with pytest.raises(ProtocolError, match="behind"):
        book.close(3, "a", 2, 2)
    with pytest.raises(ProtocolError, match="stale"):
        book.check(3)  # of the last step, but not held here
    book.check(0)  # held in the step just taken: answered again, not added
    alone = StageSteps(m, _opt(m), closes=0, accumulate=2)
    with pytest.raises(ProtocolError):
        alone.close(0, "a", 1, 1)


def test_local_stepping_every_accumulate_backwards() -> None:
    m = _model()
    book = StageSteps(m, _opt(m), closes=0, accumulate=2)
    for mb in range(5):
        _loss(m, mb).backward()
        book.backward_done(mb)
    assert book.version == 2


def test_step_of_counts_and_step_headers() -> None:
    assert [step_of(m, 2, 3) for m in range(14)] == [0] * 6 + [1] * 6 + [2] * 2
    assert decode_count(encode_count(5)) == 5
    assert decode_step_note(encode_step_note(3, 2)) == (3, 2)
    for bad in ("3", "0,2", "3,2,1", "3,-1", ""):
        with pytest.raises(ProtocolError):
            decode_step_note(bad)
    for bad in ("", "-1", "1.5", "٣", "99999999", "x"):
        with pytest.raises(ProtocolError):
            decode_count(bad)
    lim = StageLimits(stage=1, stages=2, width=8, vocab=50, max_len=16, max_batch=4)
    env = Envelope(type=FORWARD, run="r", kind=STEPS, round=3, index=1, frames=0, nbytes=0, note="2,1")
    check_request(env, lim, "r")
    for bad_env in (
        Envelope(type=FORWARD, run="r", kind=STEPS, round=3, index=1, frames=1, nbytes=10, note="2,1"),
        Envelope(type=FORWARD, run="r", kind=STEPS, round=3, index=1, frames=0, nbytes=0, note="0,1"),
        Envelope(type=FORWARD, run="r", kind="activations", round=3, index=1, frames=0, nbytes=0, note="2,1"),
    ):
        with pytest.raises(ProtocolError):
            check_request(bad_env, lim, "r")


_Sums = list[dict[str, torch.Tensor]]


def _replica_steps(steps: int, snap_at: int) -> tuple[nn.Module, dict[str, object], _Sums]:
    """One replica that serves every micro-batch and steps ``steps`` times (one close of one
    micro-batch each); returns it, its snapshot after ``snap_at`` steps and each step's gradient sums."""
    m = _model()
    opt = _opt(m)
    sums: list[dict[str, torch.Tensor]] = []

    def own(step: int, expected: int, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        sums.append({k: v.clone() for k, v in grads.items()})
        return grads

    book = StageSteps(m, opt, closes=1, step_sync=own)
    snap: dict[str, object] = {}
    for step in range(steps):
        if step == snap_at:
            snap = {"model": {k: v.clone() for k, v in m.state_dict().items()}, "opt": _clone(opt)}
        _loss(m, step).backward()
        book.backward_done(step)
        assert book.close(step, "t", 1, 1) is True
    return m, snap, sums


def _clone(opt: torch.optim.Optimizer) -> dict[str, object]:
    import copy

    return copy.deepcopy(opt.state_dict())


def test_a_syncing_server_logs_the_stage_steps_and_replays_them_onto_a_snapshot() -> None:
    ref, snap, sums = _replica_steps(6, snap_at=3)
    m = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))  # other initial parameters
    opt = _opt(m)

    def stage(step: int, expected: int, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        assert all(not bool(g.any()) for g in grads.values())  # it served nothing: zeros
        return sums[step]

    book = StageSteps(m, opt, closes=1, step_sync=stage)
    book.start_syncing()
    assert book.adoptable_from is None  # no close heard yet
    with pytest.raises(ProtocolError, match="busy"):
        book.check(2)  # no micro-batch while catching up
    for step in range(2, 6):  # it joined during step 2
        assert book.close(step, "t", 1, 1) is True
    assert book.version == 6 and book.syncing and book.adoptable_from == 2
    assert not book.can_adopt(1)  # before the first step it followed

    def load() -> None:
        m.load_state_dict(snap["model"])  # type: ignore[arg-type]
        opt.load_state_dict(snap["opt"])  # type: ignore[arg-type]

    assert book.adopt(3, load)
    assert not book.syncing and book.version == 6
    for a, b in zip(ref.state_dict().values(), m.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # bit-identical to the replica that stepped all along
    book.check(6)  # serves again


def test_a_gap_in_the_log_refuses_older_snapshots() -> None:
    m = _model()

    def stage(step: int, expected: int, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {**grads, COUNT_KEY: torch.tensor([2.0])}  # the replicas it follows hold both

    book = StageSteps(m, _opt(m), closes=2, step_sync=stage)
    book.start_syncing()
    assert book.close(4, "a", 1, 1) is False
    book.take(complete=False)  # the other trainer never closed step 4 here: a gap
    assert book.close(5, "a", 1, 1) is False and book.close(5, "b", 1, 1) is True
    assert book.close(8, "a", 1, 1) is False  # steps 6 and 7 went by unheard: gaps
    assert book.version == 8 and book.log[4] is None and book.log[5] is not None
    assert book.log[6] is None and book.log[7] is None
    assert not book.can_adopt(4) and not book.can_adopt(5) and not book.can_adopt(7)
    assert book.adoptable_from == 8
    assert book.can_adopt(8) and book.can_adopt(9)  # a snapshot at or past the current step
    loaded: list[int] = []
    assert book.adopt(9, lambda: loaded.append(9))
    assert loaded == [9] and book.version == 9 and not book.syncing


def test_a_sum_short_of_the_completed_micro_batches_takes_no_step() -> None:
    # a server that held one of the step's micro-batches died during the close: the survivors'
    # sum counts fewer micro-batches than the trainers completed; nobody steps, the trainers feed
    # the lost one again (peers.swarm.client) and close once more
    m = _model()
    before = [p.detach().clone() for p in m.parameters()]
    book = StageSteps(m, _opt(m), closes=1, step_sync=lambda s, e, g: g)  # this server alone
    _loss(m, 0).backward()
    book.backward_done(0)
    assert book.close(0, "t", 2, 2) is False  # 1 of 2 micro-batches here
    assert book.short == 1 and book.version == 0 and book.closers == {}
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))
    _loss(m, 1).backward()  # the lost micro-batch, fed again, lands here
    book.backward_done(1)
    assert book.close(0, "t", 2, 2) is True and book.version == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, m.parameters(), strict=True))


def test_a_step_short_after_every_close_is_taken_on_what_is_there() -> None:
    # a micro-batch nobody can feed again must not stall the stage: the third close steps
    m = _model()
    book = StageSteps(m, _opt(m), closes=1, step_sync=lambda s, e, g: g)
    _loss(m, 0).backward()
    book.backward_done(0)
    assert book.close(0, "t", 1, 2) is False and book.close(0, "t", 1, 2) is False
    assert book.close(0, "t", 1, 2) is True and book.version == 1 and book.short == 2
    _loss(m, 2).backward()
    book.backward_done(2)
    assert book.close(1, "t", 1, 2) is False  # the next step may come up short again
