"""The small interfaces between swarmtrain's layers (docs/architecture.md, Interfaces).

Strategy (optimizers/) -> Collective (peers/) -> Compressor (compression/), with a Reducer applied by
the partition owner inside the collective. Each layer knows only the protocol of the one below.

Optional capabilities are declared here too, as ``runtime_checkable`` protocols a caller tests with
``isinstance`` (never by probing attribute names). A codec may say its packets' size
(:class:`SizedCompressor`); one with memory (error feedback) may make rounds transactions
(:class:`RoundTransactions`), compress flat spans (:class:`SpanCompressor`), drop stale keys
(:class:`RetainingCompressor`), save its state (:class:`StatefulCompressor`) or wrap a stateless codec
(:class:`FeedbackWrapper`). A strategy may have a sync period (:class:`PeriodicStrategy`), global
parameters apart from the model (:class:`GlobalParameters`) or a period it can enter late
(:class:`FastForward`). A reducer may tolerate Byzantine rows (:class:`ByzantineTolerant`) or decorate
an honest one (:class:`HonestWrapper`). The codecs and strategies that have a capability declare it by
subclassing its protocol, so mypy checks their signatures against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from swarmtrain.core.packet import Packet

__all__ = [
    "Compressor",
    "Reducer",
    "RoundResult",
    "GatherResult",
    "Collective",
    "Strategy",
    "StepReport",
    "RoundTransactions",
    "SpanCompressor",
    "SizedCompressor",
    "RetainingCompressor",
    "StatefulCompressor",
    "FeedbackWrapper",
    "PeriodicStrategy",
    "GlobalParameters",
    "FastForward",
    "ByzantineTolerant",
    "HonestWrapper",
]


@runtime_checkable
class Compressor(Protocol):
    """Turns a tensor into a ``Packet`` and back.

    ``key`` names what is compressed (a set of tensors by name and shape, never a position in a
    round). Stateless codecs ignore it; stateful wrappers such as error feedback keep their memory
    under it (``compress_span`` reads and writes one chunk's element range of that memory).
    """

    name: str

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet: ...

    def decompress(self, p: Packet) -> torch.Tensor: ...


@runtime_checkable
class Reducer(Protocol):
    """Combines one flat row per peer into one flat result; pure.

    Args of ``reduce``:
        stack: ``[n_peers, m]`` float tensor, one row per contributing peer.
        weights: ``[n_peers]`` non-negative weights (tokens processed by default).
    Returns:
        ``[m]`` aggregate.
    """

    name: str

    def reduce(self, stack: torch.Tensor, weights: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class RoundResult:
    """Outcome of one collective round.

    ``tensors`` holds the reduced tensors (same names, shapes, dtypes as the input) only when
    ``committed``; a round that did not commit must change nothing locally, so callers apply
    ``tensors`` themselves.
    """

    round_id: int
    participants: tuple[str, ...]
    bytes_sent: int
    bytes_received: int
    committed: bool
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    reason: str = ""
    #: the round formed without this peer and the others went on (its state is now behind theirs)
    late: bool = False


@dataclass(frozen=True)
class GatherResult:
    """Outcome of an ``all_gather``: one payload per participant (this peer's own included)."""

    round_id: int
    participants: tuple[str, ...]
    payloads: Mapping[str, bytes]
    bytes_sent: int
    bytes_received: int
    committed: bool
    reason: str = ""
    #: as ``RoundResult.late``
    late: bool = False


@runtime_checkable
class Collective(Protocol):
    """Group communication among the peers of one run.

    Implemented over hivemind P2P streams in ``peers/``; ``optimizers.inprocess`` has a small
    in-process one for unit tests of strategies.
    """

    @property
    def peer_id(self) -> str: ...

    def all_reduce(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        compressor: Compressor,
        reducer: Reducer | None = None,
        weight: float = 1.0,
        timeout: float = 60.0,
        kind: str = "reduce",
    ) -> RoundResult: ...

    def all_gather(self, payload: bytes, *, timeout: float = 60.0, kind: str = "gather") -> GatherResult: ...


@dataclass(frozen=True)
class StepReport:
    """What a strategy did on one ``step()``: whether it synced, and what the round cost."""

    synced: bool = False
    committed: bool = False
    round_id: int = -1
    participants: int = 1
    bytes_sent: int = 0
    bytes_received: int = 0
    extra: Mapping[str, float] = field(default_factory=dict)
    #: the round went on without this peer (``RoundResult.late``): it should catch up with the swarm
    late: bool = False
    #: why the round failed (``RoundResult.reason``), empty when it committed
    reason: str = ""


@runtime_checkable
class Strategy(Protocol):
    """A distributed training algorithm wrapping a model and its inner optimizer.

    The trainer calls ``step(tokens)`` after each backward pass (gradients are in ``.grad``); the
    strategy performs the inner optimizer step and any communication. ``state_dict`` restores it
    exactly (a checkpoint or a newcomer's download).
    """

    name: str

    def step(self, tokens: int) -> StepReport: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


# --- optional capabilities (see the module docstring) ------------------------------------------------


@runtime_checkable
class RoundTransactions(Protocol):
    """A codec whose memory is changed by rounds as transactions (``compression.feedback``).

    ``optimizers.base.reduce_or_rollback`` opens one around each collective call and keeps what it
    wrote only when the round commits, so a failed round leaves the memory as if never tried.
    """

    def begin_round(self) -> None:
        """Open a round; until it is committed, ``abort_round`` undoes every memory change."""
        ...

    def commit_round(self) -> None:
        """Keep what the open round wrote."""
        ...

    def abort_round(self) -> None:
        """Restore the memory the open round started from."""
        ...


@runtime_checkable
class SizedCompressor(Protocol):
    """A codec that says the exact payload size of its packets (``compression.base.Codec``): a peer
    bounds what it accepts from another by it."""

    def payload_nbytes(self, numel: int, dtype: str = "float32") -> int:
        """Exact payload bytes of a packet of ``numel`` elements of ``dtype``."""
        ...


@runtime_checkable
class SpanCompressor(Protocol):
    """A codec that keeps one flat memory per vector and compresses one element range of it at a time
    (the butterfly's chunks, whatever the group size cuts them to)."""

    def compress_span(self, t: torch.Tensor, *, key: str, lo: int, total: int) -> Packet:
        """Encode ``t``, elements ``[lo, lo + t.numel())`` of the flat vector ``key`` of ``total``
        elements, with the memory of those elements, and update only them."""
        ...


@runtime_checkable
class RetainingCompressor(Protocol):
    """A codec whose per-key memory can be dropped by prefix (an owner's aggregates of partitions it
    no longer owns)."""

    def retain(self, prefix: str, keep: str) -> None:
        """Forget the memory of every key that starts with ``prefix`` except ``keep``."""
        ...


@runtime_checkable
class StatefulCompressor(Protocol):
    """A codec with state a checkpoint or a newcomer's download must carry (error-feedback memory)."""

    def state_dict(self) -> dict[str, Any]:
        """The codec's state."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        ...


@runtime_checkable
class FeedbackWrapper(Protocol):
    """A residual (error-feedback) wrapper around a stateless codec: its packets are ``inner``'s, and
    whoever must encode without memory (an owner check's aggregates) encodes with ``inner``."""

    #: the stateless codec wrapped (it decodes every peer's packets)
    inner: Compressor

    def residual(self, key: str) -> torch.Tensor | None:
        """The residual kept under ``key``, or ``None`` before its first compress."""
        ...


@runtime_checkable
class PeriodicStrategy(Protocol):
    """A strategy that syncs once every ``inner_steps`` inner steps (DiLoCo, Streaming DiLoCo)."""

    #: H: inner steps between two syncs
    inner_steps: int


@runtime_checkable
class GlobalParameters(Protocol):
    """A strategy that keeps fp32 global (anchor) parameters apart from the local model: those, not
    the model's, are what every peer that committed the same rounds agrees on."""

    def global_parameters(self) -> dict[str, torch.Tensor]:
        """Copies of the global parameters."""
        ...


@runtime_checkable
class FastForward(Protocol):
    """A strategy that can start its current sync period some inner steps ahead (a late volunteer
    realigning its syncs with the swarm's)."""

    def fast_forward(self, steps: int) -> int:
        """Skip up to ``steps`` inner steps of the current period; returns the steps skipped."""
        ...


@runtime_checkable
class ByzantineTolerant(Protocol):
    """A reducer that tolerates ``n_byzantine`` arbitrary rows given enough of them."""

    n_byzantine: int

    def min_peers(self, f: int) -> int:
        """Rows needed to tolerate ``f`` Byzantine ones."""
        ...


@runtime_checkable
class HonestWrapper(Protocol):
    """A reducer that changes what its owner returns and names the undecorated reducer a verifier
    replicates."""

    @property
    def honest(self) -> Reducer:
        """The undecorated reducer."""
        ...
