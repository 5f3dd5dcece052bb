"""Rebalancing SWARM stages (Ryabinin et al. 2023, section 3.3): a server moves from the stage with
the most throughput to the bottleneck stage, when that raises the pipeline's throughput enough.

A pipeline runs at the rate of its slowest stage; a stage's rate is the sum of its servers'
announced throughputs. Every server evaluates the same rule on the same records, so they agree on
who moves without talking: the *donor* stage is the one with the highest rate (ties: lower index),
the *bottleneck* the one with the lowest; the donor's server with the smallest peer ID moves, and
only when the donor keeps a server, and when the rate after the move
(``min`` over stages, with the mover counted at the bottleneck's mean per-server rate) exceeds the
rate now by more than ``hysteresis`` (a fraction). That hysteresis keeps two nearly balanced stages
from trading a server back and forth on measurement noise. Servers that have not measured a
throughput yet block any move (the picture is incomplete).

Measurement noise is kept out twice more by :class:`Rebalancer`: a move happens only when every
check over ``patience`` seconds planned that same move (load measured over a window, not a spike),
and a server that moved does not move again within ``cooldown`` seconds (a moved server also blocks
every plan until it measured its new stage, since unmeasured servers block moves).

Pure: the caller passes the servers (and the clock) and gets a move or ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peers.swarm.routing import ServerInfo, servers_by_stage
from swarmtrain.core.errors import ConfigError

__all__ = ["Move", "Rebalancer", "bottleneck_stage", "plan_move", "stage_rates"]


@dataclass(frozen=True)
class Move:
    """One server's move to another stage."""

    peer_id: str
    src: int
    dst: int
    rate_before: float
    rate_after: float


def stage_rates(by_stage: Sequence[Sequence[ServerInfo]]) -> list[float]:
    """Samples per second each stage can serve: the sum of its servers' throughputs."""
    return [sum(s.throughput for s in servers) for servers in by_stage]


def plan_move(servers: Sequence[ServerInfo], stages: int, hysteresis: float = 0.2) -> Move | None:
    """The move every server agrees on for these records, or ``None``.

    Raises:
        ConfigError: ``hysteresis`` < 0 or fewer than 2 stages.
    """
    if hysteresis < 0 or stages < 2:
        raise ConfigError("need hysteresis >= 0 and stages >= 2")
    by_stage = servers_by_stage(servers, stages)
    if any(not s for s in by_stage) or any(s.throughput <= 0 for st in by_stage for s in st):
        return None
    rates = stage_rates(by_stage)
    src = max(range(stages), key=lambda i: (rates[i], -i))
    dst = min(range(stages), key=lambda i: (rates[i], i))
    if src == dst or len(by_stage[src]) < 2:
        return None
    mover = by_stage[src][0]  # sorted by peer ID
    after = list(rates)
    after[src] -= mover.throughput
    after[dst] += rates[dst] / len(by_stage[dst])  # the mover at the bottleneck's mean rate per server
    before, new = min(rates), min(after)
    if new <= before * (1.0 + hysteresis):
        return None
    return Move(mover.peer_id, src, dst, before, new)


def bottleneck_stage(servers: Sequence[ServerInfo], stages: int) -> int:
    """The stage a joining server should serve (``--stage auto``): the one with the lowest rate (a
    stage without servers has rate 0), where a server that has not measured its throughput yet counts
    at its stage's mean measured rate per server (1.0 when none is measured); ties: lower index."""
    by_stage = servers_by_stage(servers, stages)
    rates: list[float] = []
    for group in by_stage:
        measured = [s.throughput for s in group if s.throughput > 0]
        per = sum(measured) / len(measured) if measured else 1.0
        rates.append(sum(s.throughput if s.throughput > 0 else per for s in group))
    return min(range(stages), key=lambda i: (rates[i], i))


class Rebalancer:
    """:func:`plan_move` held to a plan that lasts (see the module docstring).

    Args:
        stages: pipeline stages.
        hysteresis: see :func:`plan_move`.
        patience: seconds the same move must be planned by every check before it is made.
        cooldown: seconds after this server's own move during which it does not move again.
    """

    def __init__(
        self, stages: int, hysteresis: float = 0.2, patience: float = 10.0, cooldown: float = 60.0
    ) -> None:
        if patience < 0 or cooldown < 0:
            raise ConfigError("need patience >= 0 and cooldown >= 0")
        plan_move([], stages, hysteresis)  # validates stages and hysteresis
        self.stages = stages
        self.hysteresis = hysteresis
        self.patience = float(patience)
        self.cooldown = float(cooldown)
        self._plan: tuple[str, int, int] | None = None
        self._since = 0.0
        self._moved_at = -float("inf")

    def observe(self, servers: Sequence[ServerInfo], now: float) -> Move | None:
        """The move to make now, or ``None``: the plan for ``servers`` when the same one was planned
        at every check for ``patience`` seconds."""
        move = plan_move(servers, self.stages, self.hysteresis)
        key = None if move is None else (move.peer_id, move.src, move.dst)
        if key != self._plan:
            self._plan, self._since = key, now
        if move is None or now - self._since < self.patience:
            return None
        return move

    def may_move(self, now: float) -> bool:
        """Whether this server's cooldown after its own last move is over."""
        return now - self._moved_at >= self.cooldown

    def moved(self, now: float) -> None:
        """This server moved at ``now``: its cooldown starts, and the plan starts over."""
        self._moved_at = now
        self._plan = None
