"""The data phase of ``P2PCollective.all_reduce``: a butterfly all-reduce pipelined at chunk level.

Scheme (Moshpit SGD / hivemind's averager, Ryabinin et al. 2021, on our own wire; the module docstring
of ``peers.collective`` states the guarantees): the flat fp32 vector is cut into one partition per
member and each partition into chunks of ``chunk_elems``. Every peer encodes its slice of every other
owner's partition and queues the chunks, round-robin over owners, on one persistent channel per owner
(``peers.channels``). Then one loop on the calling thread handles whatever has arrived, in any order:

* all parts of one of *my* chunks are in: reduce that chunk, encode the aggregate once, queue it to
  every other member and decode the same bytes into my result (the owner decodes what it sends);
* an aggregate chunk of another owner is in: decode it straight into the result.

So an owner returns each chunk's aggregate as soon as that chunk is complete, aggregates of early
chunks flow while later parts are still arriving, and no phase waits for a whole partition.

Copies are kept to what the codecs require: a single fp32 input tensor is used in place (no
concatenation), every decoded aggregate is copied once into one preallocated output whose views are
returned, and the weighted mean (``MeanReducer``, the default) accumulates rows in place instead of
stacking them into an ``[n, m]`` matrix first (any other reducer, or a round with a
``ByzantineGuard``, gets the stack through the ``Reducer`` interface as before).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from peers import owner_check as oc
from peers.mailbox import Delivery, Key
from peers.messages import Envelope, encode_packet_bytes
from peers.reducers import MeanReducer
from peers.rounds import Group, RoundFailed
from peers.verify import verified_partition
from swarmtrain.core.errors import ConfigError, ProtocolError, UpdateRejected
from swarmtrain.core.protocols import Compressor, Reducer

if TYPE_CHECKING:
    from peers.collective import P2PCollective

__all__ = ["bounds", "reduce_round", "wait_until"]

logger = logging.getLogger(__name__)


def bounds(n_items: int, n_parts: int) -> list[tuple[int, int]]:
    """Contiguous near-equal ``[lo, hi)`` ranges; the first ``n_items % n_parts`` get one more."""
    base, extra = divmod(n_items, n_parts)
    out, lo = [], 0
    for i in range(n_parts):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def wait_until(
    coll: P2PCollective,
    group: Group,
    kind: str,
    ready: Callable[[dict[Key, Delivery]], bool],
    missing: Callable[[dict[Key, Delivery]], list[str]],
    deadline: float,
    what: str,
) -> dict[Key, Delivery]:
    """Wait until ``ready(slot)`` holds for the round's messages, a member aborts, or the deadline.

    Every 2 s without progress, a member in ``missing(slot)`` that disconnected fails the round early.

    Raises:
        RoundFailed: abort, timeout or a missing member gone.
    """

    def pred(slot: dict[Key, Delivery]) -> bool:
        if any(k[0] == "abort" and slot[k].env.digest == group.digest for k in slot):
            return True
        return ready(slot)

    slot = None
    start = time.monotonic()
    while slot is None and time.monotonic() < deadline:
        slot = coll._mailbox.wait(kind, group.round_id, pred, min(deadline, time.monotonic() + 2.0))
        if slot is None and time.monotonic() - start > 2.0:
            coll._check_connected(missing(coll._mailbox.snapshot(kind, group.round_id)))
    if slot is None:
        gone = [m[:12] for m in missing(coll._mailbox.snapshot(kind, group.round_id))]
        raise RoundFailed(f"timed out waiting for {what} from {gone}")
    coll._check_aborts(group, slot)
    return slot


def _flat(tensors: Mapping[str, torch.Tensor], names: list[str]) -> torch.Tensor:
    """The flat fp32 input ``[N]``: a view of a single fp32 tensor (read only here), else a copy."""
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


def reduce_round(
    coll: P2PCollective,
    tensors: Mapping[str, torch.Tensor],
    compressor: Compressor,
    reducer: Reducer,
    weight: float,
    kind: str,
    group: Group,
    deadline: float,
) -> dict[str, torch.Tensor]:
    """Run the data phase of one all-reduce round (see the module docstring); returns the result."""
    names = list(tensors)
    flat = _flat(tensors, names)  # [N]
    n_total = flat.numel()
    spec = hashlib.sha256(repr([(k, tuple(tensors[k].shape)) for k in names]).encode()).digest()[:8]
    digest = group.digest + spec
    step = coll.chunk_elems
    chunks = [[(a, min(a + step, hi)) for a in range(lo, hi, step)] for lo, hi in bounds(n_total, group.size)]
    me, members = group.index, group.members
    others = [p for p in members if p != coll.peer_id]
    base = Envelope(
        type="part", run=coll.run_id, kind=kind, round=group.round_id, digest=digest, numel=n_total
    )

    def envelope(typ: str, index: int, chunk: int, frame: bytes, w: float = 0.0) -> Envelope:
        return replace(base, type=typ, index=index, chunk=chunk, weight=w, frames=1, nbytes=len(frame))

    timings = coll.last_timings
    # 1. encode my slice of every other owner's partition; queue the chunks round-robin over owners
    sends: list[Future[None]] = []
    guard = coll.guard
    check = guard is not None and guard.owner_check and group.size >= 2  # issue 6: peers.verify
    own_frames: dict[tuple[int, int], bytes] = {}  # under the check: what I sent, for my own rows
    for c in range(max((len(ch) for ch in chunks), default=0)):
        for i, peer in enumerate(members):
            if (i == me and not check) or c >= len(chunks[i]):
                continue
            a, b = chunks[i][c]
            frame = encode_packet_bytes(compressor.compress(flat[a:b], key=f"{kind}/{group.size}/{i}/{c}"))
            if i != me:
                sends.append(coll._send(peer, envelope("part", i, c, frame, weight), [frame], deadline))
            if check:  # the same bytes to the partition's verifier
                env_v = envelope("vpart", i, c, frame, weight)
                sends += oc.send_to_verifier(coll, group, env_v, [frame], own_frames, deadline)
    coll._mark("encode_parts")

    seen, flagged = set[str](), set[str]()  # outlier evidence for the guard
    agg_codec = oc.aggregate_codec(compressor) if check else compressor
    reducer = oc.fit_reducer(reducer, group.size) if guard is not None else reducer
    fast_mean = guard is None and type(reducer) is MeanReducer
    acc = torch.empty(max((b - a for a, b in chunks[me]), default=0))  # scratch for the mean
    result = torch.empty(n_total)  # [N] fp32; every piece is decoded straight into it
    excluded: set[str] = set()
    my_todo = list(range(len(chunks[me])))
    agg_todo: dict[Key, tuple[int, int]] = {
        ("agg", p, c): (i, c) for i, p in enumerate(members) if i != me for c in range(len(chunks[i]))
    }
    aggs: dict[Key, Delivery] = {}
    my_digests: dict[tuple[int, int], bytes] = {}
    t_reduce = t_decode = t_wait = 0.0

    def chunk_in(slot: dict[Key, Delivery], c: int) -> bool:
        return all(("part", p, c) in slot for p in others)

    def ready(slot: dict[Key, Delivery]) -> bool:
        return any(chunk_in(slot, c) for c in my_todo) or any(k in slot for k in agg_todo)

    def missing(slot: dict[Key, Delivery]) -> list[str]:
        gone = {p for c in my_todo for p in others if ("part", p, c) not in slot}
        return sorted(gone | {k[1] for k in agg_todo if k not in slot})

    def delivery(slot: dict[Key, Delivery], k: Key) -> Delivery:
        d = slot[k]
        if d.env.digest != digest:
            raise RoundFailed(f"{k[0]} from {k[1][:12]} belongs to another group or tensor layout")
        return d

    def reduce_chunk(slot: dict[Key, Delivery], c: int) -> None:
        a, b = chunks[me][c]
        mine = coll._decode_chunk(compressor, (own_frames[(me, c)],), b - a) if check else flat[a:b]
        rows, weights, who = [mine], [weight], [coll.peer_id]
        for p in others:
            d = delivery(slot, ("part", p, c))
            if p in excluded:
                continue
            try:
                if d.env.index != me or d.env.numel != n_total:
                    raise ProtocolError("part for another partition or layout")
                rows.append(coll._decode_chunk(compressor, d.frames, b - a))
                weights.append(d.env.weight)
                who.append(p)
            except (ProtocolError, ValueError, RuntimeError) as e:
                excluded.add(p)  # left out of every chunk of this partition, consistently
                logger.warning("round %d: contribution of %s left out: %s", group.round_id, p[:12], e)
        if fast_mean:
            if not bool(torch.isfinite(mine).all()):
                raise UpdateRejected("reducer 'mean': this peer's own row holds NaN/Inf")
            agg = _mean_into(acc[: b - a], rows, weights)
        else:
            stack = torch.stack(rows)  # [n, b - a]
            agg = reducer.reduce(stack, torch.tensor(weights, dtype=torch.float32))
            if tuple(agg.shape) != (b - a,):
                raise ProtocolError(f"reducer returned shape {tuple(agg.shape)}")
            if guard is not None:
                oc.flag_rows(stack, agg, who, seen, flagged)
                if guard.owner_attack is not None:  # simulations: a Byzantine owner (issue 6)
                    agg = guard.owner_attack.corrupt_aggregate(agg)
        frame = oc.encode_aggregate(agg_codec, agg, kind, group.size, me, c)
        own_frames[(-1 - me, c)] = frame
        env = envelope("agg", me, c, frame)
        sends.extend(coll._send(p, env, [frame], deadline) for p in others)
        result[a:b].copy_(coll._decode_chunk(compressor, (frame,), b - a))

    verified = False

    def verify() -> None:  # as the verifier of partition j (owner check), once my partition is done
        nonlocal verified
        j = verified_partition(group.size, me, group.round_id)
        args = (own_frames, weight, compressor, reducer, base, digest, deadline, seen, flagged)
        vd, vsends = oc.verify_partition(coll, group, j, chunks[j], *args)
        sends.extend(vsends)
        my_digests.update({(j, c): dg for c, dg in vd.items()})
        verified = True

    # 2. handle whatever arrived: my complete chunks first (others wait on them), then aggregates
    while my_todo or agg_todo:
        t0 = time.perf_counter()
        slot = wait_until(coll, group, kind, ready, missing, deadline, "parts or aggregates")
        t1 = time.perf_counter()
        for c in [c for c in my_todo if chunk_in(slot, c)]:
            reduce_chunk(slot, c)
            my_todo.remove(c)
        if check and not my_todo and not verified:
            verify()
        t2 = time.perf_counter()
        for k in [k for k in agg_todo if k in slot]:
            i, c = agg_todo.pop(k)
            d = delivery(slot, k)
            if d.env.index != i or d.env.numel != n_total:
                raise ProtocolError(f"aggregate from {k[1][:12]} is for another partition or layout")
            a, b = chunks[i][c]
            result[a:b].copy_(coll._decode_chunk(compressor, d.frames, b - a))
            aggs[k] = d
        t_wait, t_reduce, t_decode = t_wait + t1 - t0, t_reduce + t2 - t1, t_decode + time.perf_counter() - t2
    if check and not verified:  # my partition had no chunks
        verify()
    if guard is not None:
        guard.observe(seen, flagged)
    coll._mark("exchange")
    timings.update(wait_in_exchange=t_wait, reduce_encode_agg=t_reduce, decode_aggs=t_decode)
    coll._settle_sends(sends, deadline)
    coll._mark("wait_sends")
    if check:
        oc.check_aggregates(coll, group, chunks, aggs, own_frames, my_digests, kind, digest, deadline)
        coll._mark("owner_check")
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for name in names:  # views of the one fresh result buffer: no further copy for fp32 tensors
        t = tensors[name]
        piece = result[offset : offset + t.numel()].view(t.shape)
        out[name] = piece if t.dtype == torch.float32 else piece.to(t.dtype)
        offset += t.numel()
    return out
