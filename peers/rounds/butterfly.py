"""The data phase of ``P2PCollective.all_reduce``: a butterfly all-reduce pipelined at chunk level.

Scheme (Moshpit SGD / hivemind's averager, Ryabinin et al. 2021, on our own wire; the module docstring
of ``peers.rounds.collective`` states the guarantees): the flat fp32 vector is cut into one partition per
member and each partition into chunks (``peers.wire.mailbox.chunk_step``: at least 4 per partition
while they stay >= 16K elements, at most ``chunk_elems``). Every peer encodes its slice of every other
owner's partition and queues the chunks, round-robin over owners, on one persistent channel per owner
(``peers.wire.channels``). Then one loop on the calling thread handles whatever has arrived, in any order:

* all parts of one of *my* chunks are in: reduce that chunk, encode the aggregate once, queue it to
  every other member and decode the same bytes into my result (the owner decodes what it sends);
* an aggregate chunk of another owner is in: decode it straight into the result.

So an owner returns each chunk's aggregate as soon as that chunk is complete, aggregates of early
chunks flow while later parts are still arriving, and no phase waits for a whole partition.

Copies are kept to what the codecs require: a single fp32 input tensor is used in place (no
concatenation), every decoded aggregate is copied once into one preallocated output whose views are
returned, and the weighted mean (``MeanReducer``, the default) accumulates rows in place instead of
stacking them into an ``[n, m]`` matrix first. Any other reducer, or a round with a verification
step that needs the stack, gets the stack through the ``Reducer`` interface.

How the vector is cut and how parts and aggregates are encoded (keys of error-feedback memory) is
``peers.rounds.reduce_job``. A verification step (``peers.rounds.reduce_check.ReduceCheck``; the
replicated-owner check of ``peers.rounds.owner_check``) is called at fixed points of the round and is
``NoCheck`` when none is configured; the data phase itself has no branch for it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import Future

import torch

from peers.reducers import MeanReducer
from peers.rounds import weights as claims
from peers.rounds.phases import Stopwatch
from peers.rounds.reduce_check import NoCheck, ReduceCheck
from peers.rounds.reduce_job import Layout, ReduceJob, bounds
from peers.rounds.round_io import RoundIO, Slot
from peers.wire.mailbox import Delivery, Key, chunk_step
from swarmtrain.core.errors import ConfigError, ProtocolError, UpdateRejected
from swarmtrain.core.protocols import Compressor, Reducer

__all__ = ["bounds", "Layout", "ReduceJob", "ReduceCheck", "NoCheck", "ButterflyRound", "reduce_round"]

logger = logging.getLogger(__name__)


def _flat(tensors: Mapping[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    """The flat fp32 input ``[N]``, on the tensors' device: a view of a single fp32 tensor (read only
    here), else a copy."""
    if len(names) == 1 and tensors[names[0]].dtype == torch.float32:
        return tensors[names[0]].detach().reshape(-1)
    if not names:
        return torch.zeros(0)
    return torch.cat([tensors[k].detach().reshape(-1).to(torch.float32) for k in names])


def _mean_into(acc: torch.Tensor, rows: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """Weighted mean of ``rows`` accumulated in place into ``acc`` (``MeanReducer``'s rule and errors)."""
    total = float(sum(weights))
    if not total > 0 or total == float("inf"):
        raise ConfigError("reducer 'mean': weights must be finite and sum to a positive number")
    torch.mul(rows[0], weights[0] / total, out=acc)
    for row, w in zip(rows[1:], weights[1:], strict=True):
        acc.add_(row, alpha=w / total)
    return acc


class ButterflyRound:
    """One peer's data phase of one all-reduce round (see the module docstring).

    Args:
        io: the round.
        tensors: name -> tensor; read only.
        compressor: codec of parts and aggregates.
        reducer: combines the rows of a chunk.
        weight: this peer's weight.
        check: the verification step (:class:`NoCheck` for none).
        chunk_elems: the most elements per chunk (one packet, one stream frame); ``chunk_step``
            cuts smaller chunks where a partition would have fewer than 4.
    """

    def __init__(
        self,
        io: RoundIO,
        tensors: Mapping[str, torch.Tensor],
        compressor: Compressor,
        reducer: Reducer,
        weight: float,
        check: ReduceCheck,
        chunk_elems: int,
    ) -> None:
        self.io = io
        self.tensors = tensors
        self.check = check
        self.flat = _flat(tensors, list(tensors))  # [N]
        #: where the input lives and the reduction runs: decoded rows are moved here once
        self.device = self.flat.device
        numel = sum(t.numel() for t in tensors.values())
        step = chunk_step(numel, io.group.size, chunk_elems)
        layout = Layout.of(tensors, io.group.digest, io.group.size, step)
        job = ReduceJob(io, layout, compressor, compressor, reducer, weight, self.device)
        self.job = check.prepare(job)
        self.chunks = layout.chunks
        self.me = io.group.index
        self.fast_mean = not check.stacks_rows and type(self.job.reducer) is MeanReducer
        self.sends: list[Future[None]] = []
        # [N] fp32 on the input's device; every piece is decoded straight into it
        self.result = torch.empty(layout.numel, device=self.device)
        longest = max((b - a for a, b in self.chunks[self.me]), default=0)
        self.acc = torch.empty(longest, device=self.device)  # mean scratch
        self.excluded: set[str] = set()  # senders left out of my partition (every chunk of it)
        #: my chunks still to reduce, and the aggregates still to receive -> (partition, chunk)
        self.my_todo = list(range(len(self.chunks[self.me])))
        self.agg_todo: dict[Key, tuple[int, int]] = {
            ("agg", p, c): (i, c)
            for i, p in enumerate(io.group.members)
            if i != self.me
            for c in range(len(self.chunks[i]))
        }
        self.agg_frames: dict[tuple[int, int], bytes] = {}  # every aggregate's bytes, mine included
        self.partition_announced = False
        self.weights_over_cap = False  # a chunk of mine was reduced with a weight above the cap

    def run(self) -> dict[str, torch.Tensor]:
        """Send the parts, exchange, settle, finish the check; returns name -> reduced tensor."""
        self.send_parts()
        self.io.mark("encode_parts")
        self.exchange()
        self.io.mark("exchange")
        if self.weights_over_cap:
            self.io.counters["weights_over_cap"] += 1
        self.io.settle(self.sends)
        self.io.mark("wait_sends")
        self.check.finish(self.agg_frames)
        return self.unflatten()

    def send_parts(self) -> None:
        """Encode my slice of every other owner's partition; queue the chunks round-robin over owners."""
        members, me, job = self.io.group.members, self.me, self.job
        order = [
            (i, c)
            for c in range(max((len(ch) for ch in self.chunks), default=0))
            for i in range(len(members))
            if c < len(self.chunks[i]) and (i != me or self.check.encodes_own_parts)
        ]
        for (i, c), frame in zip(order, job.encode_parts(self.flat, order), strict=True):
            if i != me:
                env = job.envelope("part", i, c, frame, job.weight)
                self.sends.append(self.io.send(members[i], env, [frame]))
            self.sends += self.check.part_encoded(i, c, frame)

    def exchange(self) -> None:
        """Handle whatever arrived until my chunks are reduced and every aggregate is in: my complete
        chunks first (the others wait on them), then aggregates. Books the seconds spent waiting,
        reducing (with encoding and queueing the aggregates) and decoding as sub-phases of the
        exchange (``peers.rounds.phases``)."""
        laps = Stopwatch(self.io.clock, "exchange")
        while self.my_todo or self.agg_todo:
            slot = self.io.wait(
                self._ready, self._missing, timeout_text="timed out waiting for parts or aggregates"
            )
            laps.lap("wait")
            for c in [c for c in self.my_todo if self._chunk_in(slot, c)]:
                self.reduce_chunk(slot, c)
                self.my_todo.remove(c)
            if not self.my_todo:
                self._announce_partition_done()
            laps.lap("reduce_send_aggs")
            for k in [k for k in self.agg_todo if k in slot]:
                self.take_aggregate(slot, k)
            laps.lap("decode_aggs")
        self._announce_partition_done()  # my partition may have had no chunks

    def _announce_partition_done(self) -> None:
        if not self.partition_announced:
            self.partition_announced = True
            self.sends += self.check.partition_done()

    def _chunk_in(self, slot: Slot, c: int) -> bool:
        return all(("part", p, c) in slot for p in self.io.others)

    def _ready(self, slot: Slot) -> bool:
        return any(self._chunk_in(slot, c) for c in self.my_todo) or any(k in slot for k in self.agg_todo)

    def _missing(self, slot: Slot) -> list[str]:
        others = self.io.others
        gone = {p for c in self.my_todo for p in others if ("part", p, c) not in slot}
        return sorted(gone | {k[1] for k in self.agg_todo if k not in slot})

    def rows(
        self, slot: Slot, c: int, mine: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[float], list[str]]:
        """The decoded rows of my chunk ``c`` (mine first, then the others in member order), their
        weights and senders. A contribution that fails validation is left out of every chunk of my
        partition, consistently."""
        a, b = self.chunks[self.me][c]
        rows, weights, who = [mine], [self.job.weight], [self.io.peer_id]
        for p in self.io.others:
            d = self.io.checked(slot, ("part", p, c), self.job.layout.digest)
            if p in self.excluded:
                continue
            try:
                if d.env.index != self.me or d.env.numel != self.job.layout.numel:
                    raise ProtocolError("part for another partition or layout")
                rows.append(self.job.decode_row(d.frames, b - a))
                weights.append(d.env.weight)
                who.append(p)
            except (ProtocolError, ValueError, RuntimeError) as e:
                self.excluded.add(p)
                logger.warning("round %d: contribution of %s left out: %s", self.io.round_id, p[:12], e)
        applied = claims.bound_weights(weights)
        self.weights_over_cap |= claims.over_cap(applied)
        return rows, applied, who

    def reduce_chunk(self, slot: Slot, c: int) -> None:
        """Reduce my chunk ``c``, send its encoded aggregate to every other member, decode it into my
        result."""
        a, b = self.chunks[self.me][c]
        mine = self.check.own_row(c, self.flat[a:b])  # on self.device
        rows, weights, who = self.rows(slot, c, mine)
        if self.fast_mean:
            if not bool(torch.isfinite(mine).all()):
                raise UpdateRejected("reducer 'mean': this peer's own row holds NaN/Inf")
            agg = _mean_into(self.acc[: b - a], rows, weights)
        else:
            stack = torch.stack(rows)  # [n, b - a]
            w = torch.tensor(weights, dtype=torch.float32, device=self.device)
            agg = self.job.reducer.reduce(stack, w)
            if tuple(agg.shape) != (b - a,):
                raise ProtocolError(f"reducer returned shape {tuple(agg.shape)}")
            self.check.chunk_reduced(stack, agg, who)
        frame = self.job.encode_aggregate(agg, self.me, c)
        self.agg_frames[(self.me, c)] = frame
        env = self.job.envelope("agg", self.me, c, frame)
        self.sends += self.io.send_to_others(env, [frame])
        self.result[a:b].copy_(self.io.decode_chunk(self.job.compressor, (frame,), b - a))

    def take_aggregate(self, slot: Slot, k: Key) -> None:
        """Decode the aggregate under ``k`` (another owner's chunk) into my result."""
        i, c = self.agg_todo.pop(k)
        d: Delivery = self.io.checked(slot, k, self.job.layout.digest)
        if d.env.index != i or d.env.numel != self.job.layout.numel:
            raise ProtocolError(f"aggregate from {k[1][:12]} is for another partition or layout")
        a, b = self.chunks[i][c]
        self.result[a:b].copy_(self.io.decode_chunk(self.job.compressor, d.frames, b - a))
        self.agg_frames[(i, c)] = d.frames[0]

    def unflatten(self) -> dict[str, torch.Tensor]:
        """Views of the one fresh result buffer per name: no further copy for fp32 tensors."""
        out: dict[str, torch.Tensor] = {}
        offset = 0
        for name, t in self.tensors.items():
            piece = self.result[offset : offset + t.numel()].view(t.shape)
            out[name] = piece if t.dtype == torch.float32 else piece.to(t.dtype)
            offset += t.numel()
        return out


def reduce_round(
    io: RoundIO,
    tensors: Mapping[str, torch.Tensor],
    compressor: Compressor,
    reducer: Reducer,
    weight: float,
    *,
    chunk_elems: int,
    check: ReduceCheck | None = None,
) -> dict[str, torch.Tensor]:
    """Run the data phase of one all-reduce round (see the module docstring); returns the result."""
    return ButterflyRound(io, tensors, compressor, reducer, weight, check or NoCheck(), chunk_elems).run()
