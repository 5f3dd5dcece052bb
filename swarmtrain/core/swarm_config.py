"""``[swarm]``: the run-wide settings of a SWARM pipeline, in the run's config.

Every server and trainer of a SWARM run must agree on them (the stage cut, the codecs on the wire,
how many micro-batches close an optimizer step), so they live in the config the run's peers share,
not in each peer's flags. This one type is what the SWARM roles (``swarmtrain.app.swarm``), the
simulation and the benchmarks take: a run's checked section, or one built in code (the checks are
the fields' own; a bad value raises pydantic's ``ValidationError``, which ``load_config`` turns into a
one-line ``ConfigError`` naming the key).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SwarmConfig"]


class SwarmConfig(BaseModel):
    """The ``[swarm]`` section: read by ``swarmtrain join --role server|trainer`` and
    ``swarmtrain simulate --strategy swarm`` (whose ``--stages``, ``--trainers`` and
    ``--activation-codec`` set ``stages``, ``trainers`` and ``codec``)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    stages: int = Field(default=2, ge=2, description="pipeline stages")
    codec: str = Field(default="none", description="codec of hidden states and their gradients")
    sync_codec: str = Field(default="none", description="codec of a stage's replica averaging")
    sync_period: float = Field(default=5.0, gt=0, description="seconds between two averagings of replicas")
    max_queue: int = Field(default=8, ge=1, description="requests a server holds at once")
    microbatches: int = Field(
        default=100, ge=1, description="micro-batches each trainer feeds (simulate: its --steps)"
    )
    trainers: int = Field(default=1, ge=1, description="trainers of the run (each feeds its share)")
    accumulate: int = Field(
        default=1,
        ge=1,
        description="micro-batches per trainer per optimizer step (a step's gradient is the mean over "
        "trainers * accumulate micro-batches, on the servers and in the baseline)",
    )
    device_s: float = Field(
        default=0.0,
        ge=0,
        lt=60,
        description="emulated device seconds per micro-batch on each server (0: none; benchmarks and "
        "tests give the stages equal, known costs with it on a machine with few cores)",
    )
    rebalance: bool = Field(
        default=True,
        description="servers move from an over-served stage to the bottleneck (peers.swarm.rebalance)",
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
    verify_rate: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="share of a trainer's replies checked on a second replica of the stage after each "
        "server's first (peers.swarm.verify; 0: no check at all)",
    )
