"""The small interfaces between swarmtrain's layers (DESIGN.md section 3).

Strategy (optimizers/) -> Collective (peers/) -> Compressor (compression/), with a Reducer applied by
the partition owner inside the collective. Each layer knows only the protocol of the one below.
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
