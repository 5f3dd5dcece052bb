"""Re-aligning a volunteer that keeps arriving late (``swarmtrain.app.peer.realign``): the skip grows with
each late round up to half a period, shrinks after committed rounds, and DiLoCo's period really
starts that many steps ahead."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from optimizers.diloco import DiLoCo
from swarmtrain.app.peer.realign import DECAY_AFTER, MAX_SKIP_ROUNDS, Realign, fast_forward, skip_rounds


def test_the_skip_grows_with_late_rounds_up_to_half_a_period() -> None:
    r = Realign(50)
    assert [r.late() for _ in range(7)] == [5, 10, 15, 20, 25, 25, 25]
    assert Realign(5).late() == 1  # at least one step
    assert Realign(None).late() == 0 and Realign(1).late() == 0  # no period: nothing to skip
    r = Realign(50)
    assert r.late(behind_steps=12) == 17  # how far behind the donors, plus a tenth of the period
    assert r.late(behind_steps=3) == 22  # never less than the last skip plus that tenth
    assert r.late(behind_steps=40) == 25
    assert Realign(50).joined(7) == 7 and Realign(50).joined(90) == 49 and Realign(None).joined(7) == 0


def test_the_skip_shrinks_after_committed_rounds_in_a_row() -> None:
    r = Realign(50)
    r.late()
    assert [r.committed() for _ in range(DECAY_AFTER)] == [5] * (DECAY_AFTER - 1) + [4]
    r.late()  # a late round restarts the streak
    assert r.skip == 9 and r.committed() == 9


class _Strategy:
    def __init__(self) -> None:
        self.skipped: list[int] = []

    def fast_forward(self, steps: int) -> int:
        self.skipped.append(steps)
        return min(steps, 3)


def test_fast_forward_moves_the_trainer_step_with_the_strategy() -> None:
    trainer = SimpleNamespace(strategy=_Strategy(), step=100)
    assert fast_forward(trainer, 5) == 3 and trainer.step == 103
    assert fast_forward(trainer, 0) == 0 and trainer.strategy.skipped == [5]
    plain = SimpleNamespace(strategy=object(), step=7)  # a strategy that cannot: nothing happens
    assert fast_forward(plain, 5) == 0 and plain.step == 7


class _Periodic(_Strategy):
    inner_steps = 10


def test_a_state_older_than_the_next_round_moves_the_step_count_by_whole_periods() -> None:
    """A newcomer that adopted a snapshot taken one round before the swarm's latest commit keeps the
    swarm's step numbers (one period ahead), so its last sync is the run's last round; only for a
    periodic strategy that can realign, and never for a round gap beyond ``MAX_SKIP_ROUNDS``."""
    trainer = SimpleNamespace(strategy=_Periodic(), step=40)
    assert skip_rounds(trainer, 1) == 10 and trainer.step == 50
    assert trainer.strategy.skipped == []  # the phase inside the period is left as it is
    assert skip_rounds(trainer, 0) == 0 and skip_rounds(trainer, -3) == 0 and trainer.step == 50
    assert skip_rounds(trainer, MAX_SKIP_ROUNDS + 1) == 0 and trainer.step == 50  # a round from far ahead
    for other in (_Strategy(), object()):  # no period, or cannot realign (Streaming DiLoCo, DeMo, DP)
        plain = SimpleNamespace(strategy=other, step=7)
        assert skip_rounds(plain, 1) == 0 and plain.step == 7


def test_diloco_syncs_after_the_rest_of_a_fast_forwarded_period() -> None:
    from optimizers.base import StrategyContext
    from optimizers.inprocess import InProcessGroup
    from swarmtrain.core.config import CompressionConfig, DiLoCoConfig

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    group = InProcessGroup(1)
    ctx = StrategyContext(model, opt, DiLoCoConfig(inner_steps=10), CompressionConfig(), collective=group[0])
    d = DiLoCo(ctx)
    assert d.fast_forward(4) == 4
    synced = [d.step(1).synced for _ in range(6)]
    assert synced == [False] * 5 + [True]  # 4 skipped + 6 trained = one period of 10
    assert d.fast_forward(100) == 9  # never past the period's last step


def test_steps_behind_from_the_state_age_at_own_or_the_donors_rate() -> None:
    from swarmtrain.app.peer.realign import steps_behind

    def rec(peer: str, tps: float, role: str = "trainer") -> SimpleNamespace:
        return SimpleNamespace(peer_id=peer, throughput=tps, role=role)

    live = [rec("me", 1e9), rec("a", 1000.0), rec("b", 3000.0), rec("c", 2000.0), rec("d", 1e9, "bootstrap")]
    node = SimpleNamespace(peer_id="me", live_peers=lambda timeout: live)
    assert steps_behind(node, 2.0, 5.0) == 10  # its own measured rate
    assert steps_behind(node, 2.0, None, tokens_per_step=100) == 40  # the others' median: 20 steps/s
    assert steps_behind(node, 0.0, 5.0) == 0 and steps_behind(node, float("nan"), 5.0) == 0
    alone = SimpleNamespace(peer_id="me", live_peers=lambda timeout: [rec("me", 1.0)])
    assert steps_behind(alone, 2.0, None) == 0
