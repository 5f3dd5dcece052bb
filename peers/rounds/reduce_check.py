"""The verification step the butterfly calls at fixed points of a round, and the step that does nothing.

``peers.rounds.butterfly`` runs the data phase of a round; a verification step (the replicated-owner
check and the guard's outlier evidence of ``peers.rounds.owner_check``) watches it through the hooks of
:class:`ReduceCheck` without the data phase branching on whether one is configured: :class:`NoCheck`
is the step when none is.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

import torch

from peers.rounds.reduce_job import ReduceJob

__all__ = ["ReduceCheck", "NoCheck"]


class ReduceCheck(Protocol):
    """A verification step the butterfly calls at fixed points of a round (``peers.rounds.owner_check``).

    Attributes:
        stacks_rows: the step needs every chunk's ``[n, m]`` row stack (no in-place mean).
        encodes_own_parts: this peer also encodes its parts of its *own* partition and hands them to
            :meth:`part_encoded` (a verifier replicates the owner's reduce from those bytes).
    """

    stacks_rows: bool
    encodes_own_parts: bool

    def prepare(self, job: ReduceJob) -> ReduceJob:
        """The job as the round runs it (e.g. the reducer fit to the group, another aggregate codec)."""
        ...

    def part_encoded(self, i: int, c: int, frame: bytes) -> list[Future[None]]:
        """This peer encoded ``frame``, its part of chunk ``c`` of partition ``i``; returns sends."""
        ...

    def own_row(self, c: int, raw: torch.Tensor) -> torch.Tensor:
        """The row this peer reduces for chunk ``c`` of its own partition (``raw``: its input slice),
        on ``raw``'s device."""
        ...

    def chunk_reduced(self, stack: torch.Tensor, agg: torch.Tensor, who: list[str]) -> None:
        """This peer reduced the rows ``stack`` (senders ``who``) of one of its chunks into ``agg``."""
        ...

    def partition_done(self) -> list[Future[None]]:
        """Every chunk of this peer's partition is reduced and sent; returns sends."""
        ...

    def finish(self, aggregates: dict[tuple[int, int], bytes]) -> None:
        """Every aggregate is in (``(partition, chunk) -> encoded bytes``) and the sends settled; may
        raise to fail the round."""
        ...


class NoCheck:
    """No verification: every hook does nothing."""

    stacks_rows = False
    encodes_own_parts = False

    def prepare(self, job: ReduceJob) -> ReduceJob:
        """The job unchanged."""
        return job

    def part_encoded(self, i: int, c: int, frame: bytes) -> list[Future[None]]:
        """Nothing to send."""
        return []

    def own_row(self, c: int, raw: torch.Tensor) -> torch.Tensor:
        """The input slice itself."""
        return raw

    def chunk_reduced(self, stack: torch.Tensor, agg: torch.Tensor, who: list[str]) -> None:
        """Nothing to record."""

    def partition_done(self) -> list[Future[None]]:
        """Nothing to send."""
        return []

    def finish(self, aggregates: dict[tuple[int, int], bytes]) -> None:
        """Nothing to check."""
