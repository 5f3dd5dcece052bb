"""Re-aligning a peer that keeps arriving late for its rounds.

A volunteer that arrived after its round formed adopts the state the round committed and starts its
next ``H`` inner steps from there, behind the others by the download and by however much slower its
steps are. Arriving behind them by more than the join window again, it is late again, throws its
``H`` steps away and downloads again: ``benchmarks/rejoin.py`` showed a fresh volunteer doing that
three to five times (60+ s) before its first committed round at ``H = 50``.

:class:`Realign` starts each sync period of such a peer a few inner steps ahead (DiLoCo's
``fast_forward``): it syncs after ``H - skip`` steps, with the others, and contributes the
pseudo-gradient of the steps it made (weighted by its tokens) instead of nothing. After a late round
the skip covers how far behind the donors it adopted from it is (:func:`steps_behind`: the age of
the adopted state, from the time its donor put in it, at this peer's step rate) plus a tenth of ``H``
for slower steps, at least the last skip plus that tenth, at most half of ``H``; it shrinks by one
step after every :data:`DECAY_AFTER` committed rounds in a row, so a peer that was only slow once
goes back to full periods. A newcomer's first period starts as far ahead as its download put it
behind (:meth:`Realign.joined`, at the donors' published rate). A peer 10x slower than the others
stays late (half of ``H`` is not enough), as it should.
"""

from __future__ import annotations

import logging
import math
import statistics
from typing import Any

from swarmtrain.core.errors import SwarmError
from swarmtrain.core.protocols import FastForward, PeriodicStrategy

__all__ = ["Realign", "DECAY_AFTER", "fast_forward", "skip_rounds", "steps_behind", "state_age"]

logger = logging.getLogger(__name__)

#: committed rounds in a row after which the skip shrinks by one step
DECAY_AFTER = 4
#: rounds an adopted state may be behind the next round for the step count to follow (``skip_rounds``)
MAX_SKIP_ROUNDS = 2


class Realign:
    """How many inner steps ahead a peer with sync period ``period`` starts each period.

    Args:
        period: the strategy's inner steps per sync (``H``); < 2 (or unknown): never skips.
    """

    def __init__(self, period: int | None) -> None:
        self.period = int(period) if period else 0
        self.skip = 0
        self._streak = 0

    @property
    def max_skip(self) -> int:
        """At most half a period is skipped."""
        return self.period // 2

    def late(self, behind_steps: int = 0) -> int:
        """A round went on without this peer, which is now ``behind_steps`` inner steps behind the
        peers it caught up with: skip more from now on; returns the skip."""
        self._streak = 0
        if self.period >= 2:
            self.skip = min(self.max_skip, max(self.skip, behind_steps) + max(1, self.period // 10))
        return self.skip

    def joined(self, behind_steps: int) -> int:
        """A newcomer adopted the run's state ``behind_steps`` steps behind its donors: the skip of
        its first period only, up to the period's last step (it has no local work to lose yet)."""
        return min(max(behind_steps, 0), self.period - 1) if self.period >= 2 else 0

    def committed(self) -> int:
        """It took part in a round: after :data:`DECAY_AFTER` in a row, skip one step less."""
        self._streak += 1
        if self._streak >= DECAY_AFTER and self.skip > 0:
            self.skip -= 1
            self._streak = 0
        return self.skip


def fast_forward(trainer: Any, steps: int) -> int:
    """Start the trainer's current sync period ``steps`` inner steps ahead, when its strategy can
    (``fast_forward``; DiLoCo); the trainer's step count moves with it so the swarm's step numbers
    stay aligned. Returns the steps skipped (0: none, or a strategy that cannot)."""
    if steps <= 0 or not isinstance(trainer.strategy, FastForward):
        return 0
    k = int(trainer.strategy.fast_forward(steps))
    trainer.step += k
    return k


def skip_rounds(trainer: Any, rounds: int) -> int:
    """A state adopted ``rounds`` rounds older than the round this peer joins next (its donor
    snapshot was taken before the swarm's latest commit): the trainer's step count moves ahead by as
    many sync periods, so the peer's syncs keep the swarm's step numbers and its last sync is the
    swarm's last round (one period behind, a newcomer would wait for a round nobody else runs).
    Only for a strategy with one round per period of ``H`` steps that can realign (DiLoCo), and at
    most :data:`MAX_SKIP_ROUNDS` rounds (the race it answers costs one; a round number further ahead
    comes from the others' records, which a few peers could inflate); returns the steps added."""
    strategy = trainer.strategy
    if (
        not 0 < rounds <= MAX_SKIP_ROUNDS
        or not isinstance(strategy, FastForward)
        or not isinstance(strategy, PeriodicStrategy)
    ):
        return 0
    k = rounds * int(strategy.inner_steps)
    trainer.step += k
    logger.info("the adopted state is %d round(s) old: step count %d ahead", rounds, k)
    return k


def state_age(meta: Any) -> float:
    """Seconds since a state snapshot was taken (its meta's ``time``, DHT time); 0 when it does not
    say (an older peer's snapshot) or says something unusable."""
    from peers.dht.node import dht_time

    taken = meta.get("time") if isinstance(meta, dict) else None
    if not isinstance(taken, int | float) or isinstance(taken, bool) or not math.isfinite(taken):
        return 0.0
    return max(dht_time() - float(taken), 0.0)


def steps_behind(node: Any, seconds: float, steps_per_s: float | None, tokens_per_step: int = 1) -> int:
    """Inner steps the others made in the ``seconds`` since the donor took the state this peer
    adopted, at ``steps_per_s`` (``None``: the other live trainers' median published throughput over
    ``tokens_per_step``, for a newcomer that has not measured its own rate yet); 0 when unknown."""
    if steps_per_s is None:
        try:
            live = node.live_peers(timeout=5.0)
        except SwarmError:
            return 0
        rates = [r.throughput for r in live if r.peer_id != node.peer_id and r.role == "trainer"]
        steps_per_s = statistics.median(rates) / max(tokens_per_step, 1) if rates else 0.0
    steps = seconds * steps_per_s
    return math.ceil(steps) if math.isfinite(steps) and steps > 0 else 0
