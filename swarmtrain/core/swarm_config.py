"""``[swarm]``: the run-wide settings of a SWARM pipeline, in the run's config.

Every server and trainer of a SWARM run must agree on them (the stage cut, the codecs on the wire,
how many micro-batches close an optimizer step), so they live in the config the run's peers share,
not in each peer's flags. The fields and their checks are those of
``swarmtrain.app.swarm.roles.SwarmSettings``, which ``swarmtrain.app.swarm.join`` builds from this
section (a test keeps the two field sets and their defaults equal).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SwarmConfig"]


class SwarmConfig(BaseModel):
    """The ``[swarm]`` section (read by ``swarmtrain join --role server|trainer``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    stages: int = Field(default=2, ge=2, description="pipeline stages")
    codec: str = Field(default="none", description="codec of hidden states and their gradients")
    sync_codec: str = Field(default="none", description="codec of a stage's replica averaging")
    sync_period: float = Field(default=5.0, gt=0, description="seconds between two averagings of replicas")
    max_queue: int = Field(default=8, ge=1, description="requests a server holds at once")
    microbatches: int = Field(default=100, ge=1, description="micro-batches each trainer feeds")
    trainers: int = Field(default=1, ge=1, description="trainers of the run (each feeds its share)")
    accumulate: int = Field(default=1, ge=1, description="micro-batches per trainer per optimizer step")
    device_s: float = Field(default=0.0, ge=0, lt=60, description="emulated device seconds per micro-batch")
    rebalance: bool = Field(
        default=True, description="servers move from an over-served stage to the bottleneck"
    )
    hysteresis: float = Field(
        default=0.2, ge=0, description="a move must raise the pipeline's rate by this fraction"
    )
    patience: float = Field(
        default=10.0, ge=0, description="seconds the same move must be planned before it is made"
    )
    cooldown: float = Field(
        default=60.0, ge=0, description="seconds before a server that moved may move again"
    )
