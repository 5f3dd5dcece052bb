"""An in-process ``Collective`` for unit tests and single-process benchmarks.

``InProcessGroup(n)`` hands out ``n`` ``InProcessCollective`` members meant to be driven from ``n``
threads of one process. Members meet at a ``threading.Barrier``; member 0 reduces. The data path
mirrors the real collective (``peers.P2PCollective``) so strategies see the same numbers:

1. every member compresses its own tensors with *its* compressor (``key`` = tensor name) and the
   decoded values are what the reducer sees (so a codec's error is really applied);
2. the reducer (``None``: token-weighted mean) combines one row per member, in member order;
3. the aggregate is compressed once (``key`` = ``"<name>/result"``) and every member decodes the same
   packet, so results are bit-identical across members.

Byte counts are packet payload bytes: ``bytes_sent`` is what this member's packets carry,
``bytes_received`` what the result packets carry (zero in a group of one: nothing travels).
Rounds can be made to fail on purpose (``fail_rounds``) to test the "a failed round changes nothing"
rule. A barrier timeout breaks the group for good (test helper, not a network).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import Compressor, GatherResult, Reducer, RoundResult

__all__ = ["InProcessGroup", "InProcessCollective"]


@dataclass
class _Contribution:
    tensors: dict[str, torch.Tensor]
    weight: float
    nbytes: int
    failed: bool


@dataclass
class _Shared:
    n: int
    barrier: threading.Barrier
    slots: list[_Contribution | None]
    gather_slots: list[bytes | None]
    result: dict[str, torch.Tensor] = field(default_factory=dict)
    result_nbytes: int = 0
    result_error: str = ""
    fail_rounds: set[int] = field(default_factory=set)


class InProcessGroup:
    """``n`` collectives that reduce among themselves through shared memory.

    Args:
        n: number of members; each must be driven by its own thread and call the same sequence of
            collective operations.
        timeout: default barrier timeout in seconds (a hang guard).

    Example:
        >>> group = InProcessGroup(2)
        >>> a, b = group.members
    """

    def __init__(self, n: int, timeout: float = 30.0) -> None:
        if n < 1:
            raise ConfigError(f"InProcessGroup needs at least one member, got {n}")
        self._shared = _Shared(
            n=n,
            barrier=threading.Barrier(n, timeout=timeout),
            slots=[None] * n,
            gather_slots=[None] * n,
        )
        self.members: list[InProcessCollective] = [InProcessCollective(self._shared, i) for i in range(n)]

    def fail_rounds(self, round_ids: set[int]) -> None:
        """Make the rounds with these ids end uncommitted for every member (tests of failure paths)."""
        self._shared.fail_rounds = set(round_ids)

    def __len__(self) -> int:
        return self._shared.n

    def __getitem__(self, i: int) -> InProcessCollective:
        return self.members[i]


class InProcessCollective:
    """One member of an ``InProcessGroup``; implements ``swarmtrain.core.protocols.Collective``."""

    def __init__(self, shared: _Shared, index: int) -> None:
        self._shared = shared
        self._index = index
        self._round = 0

    @property
    def peer_id(self) -> str:
        return f"inproc-{self._index}"

    @property
    def rounds(self) -> int:
        """How many rounds (reduce or gather) this member has entered."""
        return self._round

    def _wait(self, timeout: float) -> bool:
        try:
            self._shared.barrier.wait(timeout)
        except threading.BrokenBarrierError:
            return False
        return True

    def _participants(self) -> tuple[str, ...]:
        return tuple(f"inproc-{i}" for i in range(self._shared.n))

    def all_reduce(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        compressor: Compressor,
        reducer: Reducer | None = None,
        weight: float = 1.0,
        timeout: float = 60.0,
        kind: str = "reduce",
    ) -> RoundResult:
        """Reduce ``tensors`` across the group; see the module docstring for the data path."""
        round_id = self._round
        self._round += 1
        sh = self._shared
        own: dict[str, torch.Tensor] = {}
        nbytes = 0
        for name, t in tensors.items():
            packet = compressor.compress(t.detach(), key=name)
            nbytes += packet.payload_nbytes
            own[name] = compressor.decompress(packet).reshape(t.shape).to(torch.float32)
        sh.slots[self._index] = _Contribution(own, float(weight), nbytes, round_id in sh.fail_rounds)
        if not self._wait(timeout):
            return RoundResult(round_id, (), 0, 0, False, reason="barrier broken (timeout)")
        if self._index == 0:
            self._reduce(tensors, compressor, reducer)
        if not self._wait(timeout):
            return RoundResult(round_id, (), 0, 0, False, reason="barrier broken (timeout)")
        lone = sh.n == 1
        sent = 0 if lone else nbytes
        if round_id in sh.fail_rounds or sh.result_error:
            return RoundResult(
                round_id, self._participants(), sent, 0, False, reason=sh.result_error or "injected failure"
            )
        out = {name: sh.result[name].clone().to(tensors[name].dtype) for name in tensors}
        received = 0 if lone else sh.result_nbytes
        return RoundResult(round_id, self._participants(), sent, received, True, tensors=out)

    def _reduce(
        self, tensors: Mapping[str, torch.Tensor], compressor: Compressor, reducer: Reducer | None
    ) -> None:
        sh = self._shared
        contribs = [c for c in sh.slots if c is not None]
        sh.result, sh.result_nbytes, sh.result_error = {}, 0, ""
        if len(contribs) != sh.n or any(set(c.tensors) != set(tensors) for c in contribs):
            sh.result_error = "members sent different tensor names"
            return
        weights = torch.tensor([c.weight for c in contribs], dtype=torch.float32)
        if not bool(torch.isfinite(weights).all()) or float(weights.sum()) <= 0 or bool((weights < 0).any()):
            sh.result_error = "weights must be finite, non-negative and sum to a positive number"
            return
        for name, t in tensors.items():
            stack = torch.stack([c.tensors[name].reshape(-1) for c in contribs])  # [n, m]
            if reducer is None:
                agg = (weights[:, None] * stack).sum(0) / weights.sum()
            else:
                agg = reducer.reduce(stack, weights)
            packet = compressor.compress(agg.reshape(t.shape), key=f"{name}/result")
            sh.result_nbytes += packet.payload_nbytes
            sh.result[name] = compressor.decompress(packet).reshape(t.shape).to(torch.float32)

    def all_gather(self, payload: bytes, *, timeout: float = 60.0, kind: str = "gather") -> GatherResult:
        """Every member's ``payload`` (own included), keyed by peer id."""
        round_id = self._round
        self._round += 1
        sh = self._shared
        sh.gather_slots[self._index] = bytes(payload)
        if not self._wait(timeout):
            return GatherResult(round_id, (), {}, 0, 0, False, reason="barrier broken (timeout)")
        payloads = {f"inproc-{i}": p for i, p in enumerate(sh.gather_slots) if p is not None}
        # Second barrier: nobody overwrites a slot of this round before everyone has read it.
        if not self._wait(timeout):
            return GatherResult(round_id, (), {}, 0, 0, False, reason="barrier broken (timeout)")
        lone = sh.n == 1
        sent = 0 if lone else len(payload) * (sh.n - 1)
        received = sum(len(p) for k, p in payloads.items() if k != self.peer_id)
        if round_id in sh.fail_rounds:
            return GatherResult(round_id, self._participants(), {}, sent, 0, False, reason="injected failure")
        return GatherResult(round_id, self._participants(), payloads, sent, received, True)
