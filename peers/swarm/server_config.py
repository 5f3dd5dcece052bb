"""How a SWARM stage server serves (``peers.swarm.server``): its settings, and what tells its blocking
calls to give up."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from peers.swarm.protocol import StageLimits
from swarmtrain.core.errors import ConfigError

__all__ = ["PARAMS_IN_ALL", "PARAMS_PER_REQUESTER", "StageServerConfig", "Stopper"]


#: parameter downloads a stage server serves per minute: to one requester (a trainer settles a
#: dispute with one) and to all together; each is the stage's whole weights, so a stranger cannot
#: turn the request into an upload pump
PARAMS_PER_REQUESTER = 4
PARAMS_IN_ALL = 16


class Stopper(Protocol):
    """What tells a blocking call to give up (``threading.Event``, ``peers.GracefulExit``)."""

    def wait(self, timeout: float | None = None) -> bool: ...


@dataclass(frozen=True)
class StageServerConfig:
    """How a stage server serves.

    Attributes:
        limits: the stage and the shapes it accepts.
        max_queue: requests waiting or running at once; more are refused with ``busy``.
        accumulate: with ``closes == 0``, backward passes per optimizer step; otherwise micro-batches
            each trainer feeds per step.
        closes: trainers that close each step (0: every server steps alone; see the module docstring).
        close_timeout: seconds a step waits for the trainers that did not close it yet.
        announce_interval: seconds between two record updates (queue, throughput, version).
        device_s: emulated device seconds per micro-batch (see the module docstring; 0: none).
    """

    limits: StageLimits
    max_queue: int = 8
    accumulate: int = 1
    closes: int = 0
    close_timeout: float = 120.0
    announce_interval: float = 1.0
    device_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_queue < 1 or self.accumulate < 1 or not self.announce_interval > 0:
            raise ConfigError("need max_queue >= 1, accumulate >= 1, announce_interval > 0")
        if self.closes < 0 or not self.close_timeout > 0:
            raise ConfigError("need closes >= 0 and close_timeout > 0")
        if not 0 <= self.device_s < 60:
            raise ConfigError("need 0 <= device_s < 60")
