"""The guard's steps inside the butterfly reduce: outlier flags, and the replicated-owner check.

Both are :class:`peers.rounds.reduce_check.ReduceCheck` steps the collective hands to the butterfly when a
:class:`peers.rounds.guard.ByzantineGuard` is set (``peers.trust.verify`` states the check's scheme):

* :class:`GuardedReduce` (the guard without the owner check, or a group of one): the reducer is clamped
  to the ``f`` the group size allows (:func:`fit_reducer`: the same for every member, so bans that
  shrink a group do not stop the run), and every reduced chunk's rows are checked for outliers, the
  evidence the guard records (``observe``).
* :class:`OwnerCheck` adds the check itself: every part also goes to its partition's verifier; once
  this peer's own partition is done it reduces the partition it verifies and sends each chunk's digest
  (:meth:`OwnerCheck.partition_done`); once every aggregate is in it compares each primary's bytes with
  its verifier's digest (:meth:`OwnerCheck.finish`). Two rules make an honest primary and verifier
  compute the same bytes: every row, the owner's own included, is the *decoded* packet that was sent
  (:meth:`OwnerCheck.own_row`), and aggregates are encoded by a stateless codec
  (:func:`aggregate_codec`: error-feedback memory is per peer, so a verifier could not replicate it).

A verifier replicates the *honest* computation: a reducer may name the undecorated reducer it wraps
in an ``honest`` attribute (``swarmtrain.core.protocols.HonestWrapper``; :func:`honest_reducer`), as a
simulated malicious owner does, and the verifier reduces with that one.
"""

from __future__ import annotations

import copy
import logging
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from peers.rounds import weights as claims
from peers.rounds.reduce_job import ReduceJob
from peers.rounds.round_errors import OwnerCheckFailed
from peers.trust.verify import chunk_digest, outlier_rows, verified_partition, verifier_index
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.protocols import ByzantineTolerant, Compressor, FeedbackWrapper, HonestWrapper, Reducer

if TYPE_CHECKING:
    from peers.rounds.guard import ByzantineGuard

__all__ = [
    "GuardedReduce",
    "OwnerCheck",
    "aggregate_codec",
    "fit_reducer",
    "flag_rows",
    "honest_reducer",
    "reduce_as_owner",
]

logger = logging.getLogger(__name__)


def aggregate_codec(compressor: Compressor) -> Compressor:
    """The codec aggregates are encoded with under the check: the stateless inner codec of an
    error-feedback wrapper, else ``compressor`` itself."""
    return compressor.inner if isinstance(compressor, FeedbackWrapper) else compressor


def fit_reducer(reducer: Reducer, n_rows: int) -> Reducer:
    """``reducer`` with its ``n_byzantine`` lowered to the most ``n_rows`` rows allow (a copy)."""
    if not isinstance(reducer, ByzantineTolerant):
        return reducer
    f = reducer.n_byzantine
    if reducer.min_peers(f) <= n_rows:
        return reducer
    g = f
    while g > 0 and reducer.min_peers(g) > n_rows:
        g -= 1
    out = copy.copy(reducer)
    out.n_byzantine = g
    logger.info("group of %d: reducer tolerates f=%d instead of %d", n_rows, g, f)
    return out


def honest_reducer(reducer: Reducer) -> Reducer:
    """The reducer a verifier replicates: ``reducer.honest`` when ``reducer`` wraps one (a wrapper
    that changes what its owner returns documents its undecorated reducer there), else ``reducer``."""
    return reducer.honest if isinstance(reducer, HonestWrapper) else reducer


def reduce_as_owner(reducer: Reducer, stack: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """What an honest owner reduces ``stack``'s rows to: the honest reducer fit to the row count, the
    claimed ``weights`` under the owners' cap (``weights.bound_weights``), as the butterfly does."""
    fitted = fit_reducer(honest_reducer(reducer), stack.shape[0])
    w = torch.tensor(claims.bound_weights(weights), dtype=torch.float32, device=stack.device)
    return fitted.reduce(stack, w)


def flag_rows(
    stack: torch.Tensor, agg: torch.Tensor, who: list[str], seen: set[str], flagged: set[str]
) -> None:
    """Add the row senders ``who`` of ``stack`` to ``seen``, those of outlier rows to ``flagged``."""
    seen.update(who)
    for j in outlier_rows(stack, agg):
        flagged.add(who[j])


class GuardedReduce:
    """The guard's part of a reduce without the owner check: fit the reducer, flag outlier rows.

    Args:
        guard: receives the round's outlier evidence when every aggregate is in.
    """

    stacks_rows = True  # the outlier flags need every chunk's row stack
    encodes_own_parts = False

    def __init__(self, guard: ByzantineGuard) -> None:
        self.guard = guard
        self.seen: set[str] = set()
        self.flagged: set[str] = set()

    def prepare(self, job: ReduceJob) -> ReduceJob:
        """The job with its reducer fit to the group size."""
        return replace(job, reducer=fit_reducer(job.reducer, job.io.group.size))

    def part_encoded(self, i: int, c: int, frame: bytes) -> list[Future[None]]:
        """Nothing to send."""
        return []

    def own_row(self, c: int, raw: torch.Tensor) -> torch.Tensor:
        """The input slice itself."""
        return raw

    def chunk_reduced(self, stack: torch.Tensor, agg: torch.Tensor, who: list[str]) -> None:
        """Record which senders' rows are outliers of this chunk."""
        flag_rows(stack, agg, who, self.seen, self.flagged)

    def partition_done(self) -> list[Future[None]]:
        """Nothing to send."""
        return []

    def finish(self, aggregates: dict[tuple[int, int], bytes]) -> None:
        """Hand the round's outlier evidence to the guard."""
        self.guard.observe(self.seen, self.flagged)


class OwnerCheck(GuardedReduce):
    """The replicated-owner check (``peers.trust.verify``), for a group of at least two members."""

    encodes_own_parts = True  # the verifier of my partition needs my own parts of it too

    def __init__(self, guard: ByzantineGuard) -> None:
        super().__init__(guard)
        self.job: ReduceJob | None = None
        #: parts this peer sent of the partition it owns or verifies: (partition, chunk) -> bytes
        self.own_frames: dict[tuple[int, int], bytes] = {}
        #: this peer's digests of the aggregates of the partition it verifies: (partition, chunk) -> hash
        self.my_digests: dict[tuple[int, int], bytes] = {}

    def _job(self) -> ReduceJob:
        if self.job is None:
            raise RuntimeError("OwnerCheck used before prepare()")
        return self.job

    def prepare(self, job: ReduceJob) -> ReduceJob:
        """The job with its reducer fit to the group and a stateless aggregate codec."""
        self.job = replace(super().prepare(job), agg_codec=aggregate_codec(job.compressor))
        return self.job

    def part_encoded(self, i: int, c: int, frame: bytes) -> list[Future[None]]:
        """Send the same bytes to the partition's verifier (a ``vpart``); keep them when this peer owns
        or verifies the partition."""
        job = self._job()
        group = job.io.group
        v = verifier_index(group.size, i, group.round_id)
        if i == group.index or v == group.index:
            self.own_frames[(i, c)] = frame
        if v == group.index:
            return []
        return [job.io.send(group.members[v], job.envelope("vpart", i, c, frame, job.weight), [frame])]

    def own_row(self, c: int, raw: torch.Tensor) -> torch.Tensor:
        """The decoded bytes this peer sent to its verifier, so both reduce the same row."""
        job = self._job()
        return job.decode_row((self.own_frames[(job.io.group.index, c)],), raw.numel())

    def partition_done(self) -> list[Future[None]]:
        """Reduce the partition this peer verifies; send each chunk's digest to every other member."""
        job = self._job()
        group = job.io.group
        j = verified_partition(group.size, group.index, group.round_id)
        excluded: set[str] = set()
        sends: list[Future[None]] = []
        for c, (a, b) in enumerate(job.layout.chunks[j]):
            agg = self._verify_chunk(j, c, b - a, excluded)
            frame = job.encode_aggregate(agg, j, c)
            self.my_digests[(j, c)] = digest = chunk_digest(frame)
            sends += job.io.send_to_others(job.envelope("vdig", j, c, digest), [digest])
        return sends

    def _verify_chunk(self, j: int, c: int, length: int, excluded: set[str]) -> torch.Tensor:
        """Chunk ``c`` of partition ``j`` reduced as its primary should have: rows in the primary's
        order (its own first, then the others in member order), with the honest reducer and the
        claimed weights under the owners' cap."""
        job = self._job()
        io, me = job.io, job.io.peer_id
        got = io.wait_keys([("vpart", p, c) for p in io.others], job.layout.digest)
        owner = io.group.members[j]
        rows, weights, who = [], [], []
        for p in [owner] + [p for p in io.group.members if p != owner]:
            if p == me:
                rows.append(job.decode_row((self.own_frames[(j, c)],), length))
                weights.append(job.weight)
                who.append(p)
                continue
            if p in excluded:
                continue
            d = got[("vpart", p, c)]
            try:
                if d.env.index != j or d.env.numel != job.layout.numel:
                    raise ProtocolError("part for another partition or layout")
                rows.append(job.decode_row(d.frames, length))
                weights.append(d.env.weight)
                who.append(p)
            except (ProtocolError, ValueError, RuntimeError) as e:
                excluded.add(p)
                logger.warning("round %d: verified contribution of %s left out: %s", io.round_id, p[:12], e)
        stack = torch.stack(rows)
        agg = reduce_as_owner(job.reducer, stack, weights)
        flag_rows(stack, agg, who, self.seen, self.flagged)
        return agg

    def finish(self, aggregates: dict[tuple[int, int], bytes]) -> None:
        """Record the outlier evidence, then compare the hash of every primary's aggregate bytes (as
        this peer received them) with its verifier's digest.

        Raises:
            OwnerCheckFailed: one or more partitions differ (after recording them with the guard).
        """
        super().finish(aggregates)
        job = self._job()
        io, chunks = job.io, job.layout.chunks
        n, r, me = io.group.size, io.round_id, io.group.index
        keys = []
        for i in range(n):
            v = verifier_index(n, i, r)
            if v != me:
                keys += [("vdig", io.group.members[v], c) for c in range(len(chunks[i]))]
        got = io.wait_keys(keys, job.layout.digest)
        bad: list[tuple[str, str]] = []
        for i in range(n):
            v = verifier_index(n, i, r)
            for c in range(len(chunks[i])):
                if v == me:
                    expected = self.my_digests[(i, c)]
                else:
                    d = got[("vdig", io.group.members[v], c)]
                    expected = d.frames[0] if len(d.frames) == 1 and d.env.index == i else b""
                pair = (io.group.members[i], io.group.members[v])
                if chunk_digest(aggregates[(i, c)]) != expected and pair not in bad:
                    bad.append(pair)
        if bad:
            self.guard.owner_failed(r, bad)
            raise OwnerCheckFailed(
                f"owner check failed for {[(p[:8], v[:8]) for p, v in bad]} (primary, verifier)", bad
            )
        io.mark("owner_check")
