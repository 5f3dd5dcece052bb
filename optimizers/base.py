"""The strategy registry, the context every strategy is built from, and helpers strategies share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from compression import build_compressor
from swarmtrain.core.config import BaseStrategyConfig, CompressionConfig, StrategyConfig
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import (
    Collective,
    Compressor,
    GlobalParameters,
    Reducer,
    RoundResult,
    RoundTransactions,
    StatefulCompressor,
    StepReport,
    Strategy,
)
from swarmtrain.core.registry import Registry

__all__ = [
    "STRATEGIES",
    "StrategyContext",
    "build_strategy",
    "options_of",
    "make_compressor",
    "require_collective",
    "round_report",
    "AnchoredStrategy",
    "trainable_parameters",
    "compressor_state",
    "load_compressor_state",
    "reduce_or_rollback",
]


@dataclass
class StrategyContext:
    """Everything a strategy needs: the model, its inner optimizer, and how to talk to peers.

    ``config`` is the strategy's own validated options (``swarmtrain.core.config.DiLoCoConfig``, ...;
    ``strategy_config(name, **options)`` builds one by name); strategies trust its bounds.
    ``collective`` is ``None`` for a single-peer run; networked strategies refuse to start without one.
    ``reducer`` is applied by partition owners (``None``: token-weighted mean).
    ``compressor`` overrides the codec built from ``compression`` (tests, benchmarks); ``None``: build
    it with ``compression.build_compressor(compression, seed=codec_seed, peer=codec_peer)``.
    ``codec_seed`` is the run's codec seed and ``codec_peer`` this peer's identity (rank, or peer ID
    without one): given, the codec's random draws are seeded ``compression.peer_seed(codec_seed,
    codec_peer)``, so they differ per peer; ``None`` keeps one seed for every peer (the old default,
    which correlates a random-draw codec's noise across peers).
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    config: StrategyConfig
    compression: CompressionConfig
    collective: Collective | None = None
    reducer: Reducer | None = None
    compressor: Compressor | None = None
    codec_seed: int = 0
    codec_peer: int | str | None = None


StrategyFactory = Callable[[StrategyContext], Strategy]
STRATEGIES: Registry[StrategyFactory] = Registry("strategy")


def build_strategy(ctx: StrategyContext) -> Strategy:
    """Build the strategy named by ``ctx.config.name``.

    Raises:
        ConfigError: unknown name, or a networked strategy without a collective.
    """
    factory = STRATEGIES.get(ctx.config.name)
    strategy = factory(ctx)
    if strategy is None:  # pragma: no cover - a factory bug
        raise ConfigError(f"strategy {ctx.config.name!r} factory returned nothing")
    return strategy


C = TypeVar("C", bound=BaseStrategyConfig)


def options_of(ctx: StrategyContext, model: type[C]) -> C:
    """``ctx.config`` as the options model ``model`` of the strategy being built.

    Raises:
        ConfigError: ``ctx.config`` holds another strategy's options.
    """
    cfg = ctx.config
    if not isinstance(cfg, model):
        raise ConfigError(
            f"strategy options {type(cfg).__name__} (strategy {cfg.name!r}) given where "
            f"{model.__name__} is needed"
        )
    return cfg


def make_compressor(ctx: StrategyContext) -> Compressor:
    """The codec a strategy sends through: ``ctx.compressor`` or one built from ``ctx.compression``."""
    if ctx.compressor is not None:
        return ctx.compressor
    comp = build_compressor(ctx.compression, seed=ctx.codec_seed, peer=ctx.codec_peer)
    if comp.sends_increments:
        # EF21 packets decode to increments of each sender's running estimate; the collective's
        # owners average decoded values from whichever peers joined the round, so they cannot
        # rebuild those estimates when membership changes. Refuse rather than average wrong values.
        raise ConfigError(
            "compression.error_feedback 'ef21' sends increments, which the all-reduce cannot average "
            "across changing groups; use 'ef' with strategies"
        )
    return comp


class AnchoredStrategy(GlobalParameters):
    """Base of the strategies that keep fp32 global (anchor) parameters apart from the local model."""

    anchor: dict[str, torch.Tensor]

    def global_parameters(self) -> dict[str, torch.Tensor]:
        """Copies of the global (anchor) parameters, fp32.

        They are identical on every peer that committed the same rounds, also while the local models
        differ (between syncs, or with ``mixing > 0``): compare or evaluate these across peers.
        """
        return {n: t.clone() for n, t in self.anchor.items()}


def round_report(res: RoundResult, extra: Mapping[str, float]) -> StepReport:
    """The ``StepReport`` of a step that synced through the round ``res`` (bytes from its ledger)."""
    return StepReport(
        synced=True,
        committed=res.committed,
        round_id=res.round_id,
        participants=len(res.participants),
        bytes_sent=res.bytes_sent,
        bytes_received=res.bytes_received,
        extra=dict(extra),
        late=res.late,
        reason=res.reason,
    )


def reduce_or_rollback(
    collective: Collective,
    tensors: Mapping[str, torch.Tensor],
    *,
    compressor: Compressor,
    reducer: Reducer | None = None,
    weight: float = 1.0,
    timeout: float = 60.0,
) -> RoundResult:
    """``collective.all_reduce`` as one transaction of the codec's state.

    A codec with memory (error feedback: ``RoundTransactions``) keeps what the round wrote only when
    the round commits; a round that fails or raises leaves it as if never tried. The strategies retry
    a failed round with a pseudo-gradient covering all steps since their last good sync, so a residual
    advanced by the failed attempt would count those steps twice. Stateless codecs are passed through
    unchanged.
    """
    if not isinstance(compressor, RoundTransactions):
        return collective.all_reduce(
            tensors, compressor=compressor, reducer=reducer, weight=weight, timeout=timeout
        )
    compressor.begin_round()
    try:
        res = collective.all_reduce(
            tensors, compressor=compressor, reducer=reducer, weight=weight, timeout=timeout
        )
    except BaseException:
        compressor.abort_round()
        raise
    if res.committed:
        compressor.commit_round()
    else:
        compressor.abort_round()
    return res


def require_collective(ctx: StrategyContext, name: str) -> Collective:
    """``ctx.collective`` or a ``ConfigError`` saying that strategy ``name`` needs peers."""
    if ctx.collective is None:
        raise ConfigError(
            f"strategy {name!r} needs a collective (peers); use strategy 'local' to train alone"
        )
    return ctx.collective


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """``name -> parameter`` for every parameter with ``requires_grad``, in registration order."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise ConfigError("the model has no trainable parameters")
    return params


def compressor_state(comp: Compressor) -> dict[str, Any]:
    """The codec's own state (error-feedback residuals) if it has any, else ``{}``."""
    return dict(comp.state_dict()) if isinstance(comp, StatefulCompressor) else {}


def load_compressor_state(comp: Compressor, state: Mapping[str, Any]) -> None:
    """Restore what ``compressor_state`` returned (a no-op for stateless codecs)."""
    if not state:
        return
    if not isinstance(comp, StatefulCompressor):
        raise ConfigError("checkpoint holds codec state but the configured codec is stateless")
    comp.load_state_dict(state)
