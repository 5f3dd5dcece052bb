"""The options of each training strategy: one frozen pydantic model per strategy, chosen by ``name``.

``StrategyConfig`` is the discriminated union the run configuration's ``[strategy]`` table validates
against (``swarmtrain.core.config``); ``STRATEGY_CONFIGS`` maps each name (the names
``optimizers.STRATEGIES`` registers) to its model. An option that belongs to another strategy is
refused with one line naming the strategies it belongs to (:func:`foreign_option_message`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "BaseStrategyConfig",
    "LocalConfig",
    "SyncedStrategyConfig",
    "DataParallelConfig",
    "OuterLoopConfig",
    "DiLoCoConfig",
    "StreamingDiLoCoConfig",
    "DeMoConfig",
    "STRATEGY_CONFIGS",
    "StrategyConfig",
    "strategies_with_option",
    "foreign_option_message",
    "unknown_strategy_message",
]


class BaseStrategyConfig(BaseModel):
    """What every strategy's options share: the registry name that selects the strategy.

    Each strategy has its own frozen subclass holding only its options, so a run's options are
    validated once, here, and cannot change under a strategy that already read them. An option that
    belongs to another strategy is refused with one line naming the strategies it belongs to.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str

    @model_validator(mode="before")
    @classmethod
    def _refuse_other_strategies_options(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            own = str(cls.model_fields["name"].default)
            for key in data:
                msg = foreign_option_message(own, str(key))
                if msg is not None:
                    raise ValueError(msg)
        return data


class LocalConfig(BaseStrategyConfig):
    """``local``: train alone; nothing travels, so there is nothing to configure."""

    name: Literal["local"] = "local"


class SyncedStrategyConfig(BaseStrategyConfig):
    """Options of every strategy that talks to peers."""

    sync_timeout: float = Field(default=60.0, gt=0, description="seconds a sync round may take")


class DataParallelConfig(SyncedStrategyConfig):
    """``data_parallel``: gradient all-reduce every step (the baseline)."""

    name: Literal["data_parallel"] = "data_parallel"


class OuterLoopConfig(SyncedStrategyConfig):
    """Options of the strategies with an inner loop of H local steps and an outer Nesterov step."""

    inner_steps: int = Field(default=50, ge=1, description="H: local steps between syncs")
    outer_lr: float = Field(default=1.0, gt=0)  # not the paper's 0.7 / 0.9: docs/decisions.md
    outer_momentum: float = Field(default=0.5, ge=0, lt=1)
    nesterov: bool = True
    outer_state: Literal["device", "cpu", "cpu8"] = Field(
        default="device",
        description=(
            "where the fp32 anchor and outer momentum live: 'device' (beside the parameters), 'cpu' "
            "(pinned CPU memory on CUDA, moved per tensor around each sync; same results), 'cpu8' "
            "('cpu' with the momentum stored 8-bit blockwise; every peer of the run must use it)"
        ),
    )


class DiLoCoConfig(OuterLoopConfig):
    """``diloco``: H local steps, then an outer step on the averaged pseudo-gradient."""

    name: Literal["diloco"] = "diloco"


class StreamingDiLoCoConfig(OuterLoopConfig):
    """``streaming_diloco``: DiLoCo that syncs one of F fragments at a time, overlapped with training."""

    name: Literal["streaming_diloco"] = "streaming_diloco"
    fragments: int = Field(default=4, ge=1, description="F: how many fragments the model is cut into")
    overlap: int = Field(default=1, ge=0, description="tau: steps a fragment's sync overlaps training")
    mixing: float = Field(default=0.15, ge=0, le=1, description="alpha: weight of the local parameters")

    @model_validator(mode="after")
    def _check_schedule(self) -> StreamingDiLoCoConfig:
        """Every fragment needs its own step of the H-step cycle, and at most one may be in flight."""
        if self.fragments > self.inner_steps:
            raise ValueError(
                f"fragments ({self.fragments}) must be <= inner_steps ({self.inner_steps}): "
                "each fragment syncs at its own step of every H-step cycle"
            )
        gap = self.inner_steps // self.fragments
        if self.overlap > gap:
            raise ValueError(
                f"overlap ({self.overlap}) must be <= inner_steps // fragments ({gap}) so that at "
                "most one fragment is in flight"
            )
        return self


class DeMoConfig(SyncedStrategyConfig):
    """``demo``: all-gather of each peer's top DCT components of its local momentum."""

    name: Literal["demo"] = "demo"
    demo_chunk: int = Field(default=64, ge=2, description="side of the square DCT chunks")
    demo_topk: int = Field(default=8, ge=1, description="coefficients sent per chunk")
    demo_decay: float = Field(default=0.95, ge=0, lt=1, description="momentum decay beta")
    demo_sign: bool = True
    demo_values: Literal["fp32", "fp16", "bf16", "sign"] = Field(
        default="fp16", description="how the top-k DCT values travel"
    )

    @model_validator(mode="after")
    def _check_topk(self) -> DeMoConfig:
        """A chunk has ``demo_chunk ** 2`` coefficients to pick from."""
        if self.demo_topk > self.demo_chunk * self.demo_chunk:
            raise ValueError(
                f"demo_topk ({self.demo_topk}) exceeds the {self.demo_chunk}x{self.demo_chunk} "
                "coefficients of a chunk"
            )
        return self


# the config model of each strategy (``optimizers.STRATEGIES`` registers the same names)
STRATEGY_CONFIGS: dict[str, type[BaseStrategyConfig]] = {
    "local": LocalConfig,
    "data_parallel": DataParallelConfig,
    "diloco": DiLoCoConfig,
    "streaming_diloco": StreamingDiLoCoConfig,
    "demo": DeMoConfig,
}

StrategyConfig: TypeAlias = Annotated[
    LocalConfig | DataParallelConfig | DiLoCoConfig | StreamingDiLoCoConfig | DeMoConfig,
    Field(discriminator="name"),
]
"""The options of one strategy: the model whose ``name`` matches, chosen by pydantic."""


def strategies_with_option(key: str) -> list[str]:
    """Names of the strategies that have option ``key`` (in ``STRATEGY_CONFIGS`` order)."""
    return [name for name, model in STRATEGY_CONFIGS.items() if key in model.model_fields]


def foreign_option_message(name: str, key: str) -> str | None:
    """The error line for option ``key`` under strategy ``name`` when it belongs only to others.

    ``None`` when strategy ``name`` has the option, or when no strategy has it (a typo, which the
    model reports as an unknown field).
    """
    model = STRATEGY_CONFIGS.get(name)
    if model is None or key in model.model_fields:
        return None
    owners = strategies_with_option(key)
    if not owners:
        return None
    return f"strategy.{key} is not an option of strategy {name!r} (it belongs to: {', '.join(owners)})"


def unknown_strategy_message(name: object) -> str:
    """The error line for a strategy name that has no config model."""
    return f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGY_CONFIGS)}"
