"""The optional capabilities of ``swarmtrain.core.protocols``: held by the classes that declare them, by
no others (callers test them with ``isinstance``, never by probing attribute names)."""

from __future__ import annotations

import pytest
import torch
from strategy_helpers import IdentityCompressor, InProcessGroup, make_model, make_optimizer, make_strategy

from compression import EF21, ErrorFeedback, Int8Compressor, TernaryCompressor
from compression.staging import DeviceStaging
from peers.reducers import CoordinateMedian, MeanReducer, TrimmedMean
from peers.rounds.owner_check import aggregate_codec, fit_reducer, honest_reducer
from swarmtrain.core.protocols import (
    ByzantineTolerant,
    Compressor,
    FastForward,
    FeedbackWrapper,
    GlobalParameters,
    HonestWrapper,
    PeriodicStrategy,
    RetainingCompressor,
    RoundTransactions,
    SizedCompressor,
    SpanCompressor,
    StatefulCompressor,
    Strategy,
)
from swarmtrain.simulation.attacks.owner import MaliciousOwnerReducer

MEMORY_CAPS = (RoundTransactions, SpanCompressor, RetainingCompressor, StatefulCompressor)
CODEC_CAPS = (*MEMORY_CAPS, FeedbackWrapper, SizedCompressor, DeviceStaging)
STRATEGY_CAPS = (PeriodicStrategy, GlobalParameters, FastForward)


def _caps(obj: object, caps: tuple[type, ...]) -> set[str]:
    return {c.__name__ for c in caps if isinstance(obj, c)}


MEMORY = {c.__name__ for c in MEMORY_CAPS}


@pytest.mark.parametrize(
    ("codec", "expected"),
    [
        (ErrorFeedback(Int8Compressor()), MEMORY | {"FeedbackWrapper", "SizedCompressor"}),
        (EF21(Int8Compressor()), MEMORY | {"SizedCompressor"}),
        (TernaryCompressor(256), {"StatefulCompressor", "SizedCompressor", "DeviceStaging"}),
        (Int8Compressor(), {"SizedCompressor", "DeviceStaging"}),
        (IdentityCompressor(), set()),
    ],
    ids=["ef", "ef21", "ternary", "int8", "identity"],
)
def test_codec_capabilities(codec: Compressor, expected: set[str]) -> None:
    assert isinstance(codec, Compressor)
    assert _caps(codec, CODEC_CAPS) == expected


def test_the_wrappers_declare_their_capabilities() -> None:
    """Declared by subclassing (mypy checks the signatures), not only matched by shape."""
    for cls in (ErrorFeedback, EF21):
        assert issubclass(cls, RoundTransactions) and issubclass(cls, SpanCompressor)
        assert issubclass(cls, RetainingCompressor) and issubclass(cls, StatefulCompressor)
    assert FeedbackWrapper in ErrorFeedback.__mro__ and FeedbackWrapper not in EF21.__mro__
    assert issubclass(TernaryCompressor, StatefulCompressor)


def test_aggregate_codec_is_the_inner_codec_of_a_residual_wrapper() -> None:
    inner = Int8Compressor()
    assert aggregate_codec(ErrorFeedback(inner)) is inner
    ef21 = EF21(inner)
    assert aggregate_codec(ef21) is ef21  # its packets are increments: no stateless twin to use
    assert aggregate_codec(inner) is inner


@pytest.mark.parametrize(
    ("name", "options", "expected"),
    [
        ("diloco", {"inner_steps": 3}, {"PeriodicStrategy", "GlobalParameters", "FastForward"}),
        ("streaming_diloco", {"inner_steps": 4, "fragments": 2}, {"PeriodicStrategy", "GlobalParameters"}),
        ("data_parallel", {}, set()),
        ("demo", {}, set()),
        ("local", {}, set()),
    ],
)
def test_strategy_capabilities(name: str, options: dict[str, int], expected: set[str]) -> None:
    model = make_model()
    collective = None if name == "local" else InProcessGroup(1)[0]
    strategy = make_strategy(name, model, make_optimizer(model), collective, **options)
    assert isinstance(strategy, Strategy)
    assert _caps(strategy, STRATEGY_CAPS) == expected
    if isinstance(strategy, PeriodicStrategy):
        assert strategy.inner_steps == options["inner_steps"]
    if isinstance(strategy, GlobalParameters):
        glob = strategy.global_parameters()
        assert set(glob) == {n for n, p in model.named_parameters() if p.requires_grad}
        assert all(t.dtype == torch.float32 for t in glob.values())


def test_reducer_capabilities() -> None:
    for reducer in (MeanReducer(), TrimmedMean(n_byzantine=1), CoordinateMedian(n_byzantine=1)):
        assert isinstance(reducer, ByzantineTolerant) and not isinstance(reducer, HonestWrapper)
    honest = TrimmedMean(n_byzantine=2)
    wrapped = MaliciousOwnerReducer(honest)
    assert isinstance(wrapped, HonestWrapper) and honest_reducer(wrapped) is honest
    assert honest_reducer(honest) is honest
    fitted = fit_reducer(honest, 3)  # 3 rows cannot tolerate f=2
    assert isinstance(fitted, ByzantineTolerant) and fitted is not honest
    assert fitted.n_byzantine < 2
    assert honest.n_byzantine == 2  # a copy was fitted
