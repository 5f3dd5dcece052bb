"""``StepReport.extra["comm_wait_s"]``: how long each strategy's ``step()`` blocked on communication.

A ``SlowCollective`` sleeps a known time inside every collective call, so the reported wait has a
known lower bound (sleep never returns early); for StreamingDiLoCo the test also checks that a round
which finished in the background while training went on costs (almost) nothing to join.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytest
import torch
from strategy_helpers import InProcessGroup, backward, batch, make_model, make_optimizer, make_strategy

from optimizers import StreamingDiLoCo
from swarmtrain.core.protocols import Collective, Compressor, GatherResult, RoundResult, StepReport

DELAY = 0.3


class SlowCollective:
    """Wraps a collective; every all_reduce / all_gather sleeps ``delay`` seconds first."""

    def __init__(self, inner: Collective, delay: float = DELAY) -> None:
        self.inner = inner
        self.delay = delay
        self.calls = 0

    @property
    def peer_id(self) -> str:
        return self.inner.peer_id

    def all_reduce(
        self, tensors: Mapping[str, torch.Tensor], *, compressor: Compressor, **kw: Any
    ) -> RoundResult:
        self.calls += 1
        time.sleep(self.delay)
        return self.inner.all_reduce(tensors, compressor=compressor, **kw)

    def all_gather(self, payload: bytes, **kw: Any) -> GatherResult:
        self.calls += 1
        time.sleep(self.delay)
        res: GatherResult = self.inner.all_gather(payload, **kw)
        return res


def _steps(name: str, n: int, **opts: Any) -> tuple[list[StepReport], Any]:
    model = make_model()
    slow = SlowCollective(InProcessGroup(1)[0])
    strat = make_strategy(name, model, make_optimizer(model), slow, **opts)
    reports = []
    for s in range(n):
        backward(model, *batch(0, s))
        reports.append(strat.step(16))
    strat.close()
    return reports, slow


@pytest.mark.parametrize("name", ["data_parallel", "demo"])
def test_every_step_reports_the_blocking_collective(name: str) -> None:
    opts = {"demo_chunk": 4, "demo_topk": 2} if name == "demo" else {}
    reports, slow = _steps(name, 3, **opts)
    assert slow.calls == 3
    for r in reports:
        assert r.synced and r.committed
        assert r.extra["comm_wait_s"] >= DELAY


def test_diloco_reports_wait_only_on_sync_steps() -> None:
    reports, slow = _steps("diloco", 6, inner_steps=3)
    assert slow.calls == 2
    waits = [r.extra["comm_wait_s"] for r in reports]
    assert [r.synced for r in reports] == [False, False, True, False, False, True]
    assert waits[0] == waits[1] == waits[3] == waits[4] == 0.0
    assert waits[2] >= DELAY and waits[5] >= DELAY


def test_streaming_without_overlap_reports_the_synchronous_reduce() -> None:
    opts = {"inner_steps": 4, "fragments": 2, "overlap": 0, "mixing": 0.0}
    reports, slow = _steps("streaming_diloco", 4, **opts)
    synced = [r for r in reports if r.synced]
    assert slow.calls == 2 and len(synced) == 2
    assert all(r.extra["comm_wait_s"] >= DELAY for r in synced)
    assert all(r.extra["comm_wait_s"] == 0.0 for r in reports if not r.synced)
    assert sorted(r.extra["fragment"] for r in synced) == [0.0, 1.0]


def test_streaming_overlap_hides_a_finished_round_and_counts_a_late_one() -> None:
    model = make_model()
    slow = SlowCollective(InProcessGroup(1)[0])
    opts = {"inner_steps": 4, "fragments": 2, "overlap": 1, "mixing": 0.0}
    strat = make_strategy("streaming_diloco", model, make_optimizer(model), slow, **opts)
    assert isinstance(strat, StreamingDiLoCo)

    def step(s: int) -> StepReport:
        backward(model, *batch(0, s))
        return strat.step(16)

    r1 = step(0)  # phase 1 of H = 4: nothing due (offsets 0 and 2)
    assert not r1.synced and r1.extra["comm_wait_s"] == 0.0
    r2 = step(1)  # phase 2: fragment 1 starts in the background, applied at step 3
    assert not r2.synced and r2.extra["comm_wait_s"] == 0.0
    assert strat.pending is not None and strat.pending.future is not None
    # the caller's next step comes right away: it must wait for (most of) the sleep
    late = step(2)
    assert late.synced and late.committed and late.extra["fragment"] == 1.0
    assert late.extra["comm_wait_s"] >= DELAY / 2

    r4 = step(3)  # phase 0: fragment 0 starts, applied at step 5
    assert not r4.synced
    assert strat.pending is not None and strat.pending.future is not None
    deadline = time.monotonic() + 30.0  # hang guard
    while not strat.pending.future.done():
        assert time.monotonic() < deadline, "background round hung"
        time.sleep(0.01)
    hidden = step(4)  # the round finished while "training": joining it costs ~nothing
    assert hidden.synced and hidden.committed and hidden.extra["fragment"] == 0.0
    assert hidden.extra["comm_wait_s"] < DELAY / 2
    strat.close()
