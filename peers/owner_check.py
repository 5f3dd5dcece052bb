"""The replicated-owner check inside ``P2PCollective``'s all-reduce (see ``peers.verify`` for the scheme).

Helpers the collective calls when a :class:`peers.guard.ByzantineGuard` with ``owner_check`` is set:
the verifier's reduce of the partition it checks (:func:`verify_partition`), the comparison of every
primary's aggregate bytes with its verifier's digest (:func:`check_aggregates`), and the two small
rules that make an honest primary and verifier compute the same bytes: every row, the owner's own
included, is the *decoded* packet that was sent (:func:`own_row`), and aggregates are encoded by a
stateless codec (:func:`aggregate_codec`: error-feedback memory is per peer, so a verifier could not
replicate it). Reducers are clamped to the ``f`` the group size allows (:func:`fit_reducer`), which is
the same for every member, so bans that shrink a group do not stop the run.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from peers.messages import Envelope, encode_packet_bytes
from peers.rounds import Group, ListsBannedPeer, Matchmaker
from peers.verify import OwnerCheckFailed, chunk_digest, outlier_rows, verifier_index
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.protocols import Compressor, Reducer

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = [
    "form_group",
    "aggregate_codec",
    "encode_aggregate",
    "fit_reducer",
    "send_to_verifier",
    "verify_partition",
    "check_aggregates",
    "flag_rows",
]

logger = logging.getLogger(__name__)


def form_group(coll: Any, matchmaker: Matchmaker, kind: str, round_id: int, deadline: float) -> Group:
    """Refresh the bans from the guard (if any) into ``matchmaker``, then form the round's group.

    A member that refuses a list holding a banned peer tells the list's members to abort at once.
    """
    if coll.guard is not None:
        left = max(deadline - time.monotonic(), 0.5)
        matchmaker.banned = frozenset(coll.guard.refresh(min(5.0, left / 4)))
    try:
        return matchmaker.form_group(kind, round_id, deadline)
    except ListsBannedPeer as e:
        coll._abort(e.group, kind, str(e))
        raise


def aggregate_codec(compressor: Compressor) -> Compressor:
    """The codec aggregates are encoded with under the check: the stateless inner codec of an
    error-feedback wrapper, else ``compressor`` itself."""
    inner = getattr(compressor, "inner", None)
    if inner is not None and hasattr(compressor, "residual"):
        return inner  # type: ignore[no-any-return]
    return compressor


def fit_reducer(reducer: Reducer, n_rows: int) -> Reducer:
    """``reducer`` with its ``n_byzantine`` lowered to the most ``n_rows`` rows allow (a copy)."""
    f = getattr(reducer, "n_byzantine", None)
    min_peers = getattr(reducer, "min_peers", None)
    if not isinstance(f, int) or not callable(min_peers) or min_peers(f) <= n_rows:
        return reducer
    g = f
    while g > 0 and min_peers(g) > n_rows:
        g -= 1
    out = copy.copy(reducer)
    out.n_byzantine = g  # type: ignore[attr-defined]
    logger.info("group of %d: reducer tolerates f=%d instead of %d", n_rows, g, f)
    return out


def flag_rows(
    stack: torch.Tensor, agg: torch.Tensor, who: list[str], seen: set[str], flagged: set[str]
) -> None:
    """Add the row senders ``who`` of ``stack`` to ``seen``, those of outlier rows to ``flagged``."""
    seen.update(who)
    for j in outlier_rows(stack, agg):
        flagged.add(who[j])


def encode_aggregate(codec: Compressor, agg: torch.Tensor, kind: str, size: int, i: int, c: int) -> bytes:
    """The encoded aggregate chunk ``c`` of partition ``i`` (primary and verifier use the same key)."""
    return encode_packet_bytes(codec.compress(agg, key=f"{kind}/agg/{size}/{i}/{c}"))


def send_to_verifier(
    coll: Any,
    group: Group,
    env: Envelope,
    frames: list[bytes],
    own_frames: dict[tuple[int, int], bytes],
    deadline: float,
) -> list[Future[None]]:
    """Send the part ``env`` (partition ``env.index``, type ``vpart``) to that partition's verifier
    too; keep the bytes in ``own_frames`` when this peer owns or verifies the partition."""
    i, c, me = env.index, env.chunk, group.index
    v = verifier_index(group.size, i, group.round_id)
    if i == me or v == me:
        own_frames[(i, c)] = frames[0]
    return [] if v == me else [coll._send(group.members[v], env, frames, deadline)]


def verify_partition(
    coll: Any,
    group: Group,
    j: int,
    chunks: list[tuple[int, int]],
    own_frames: dict[tuple[int, int], bytes],
    weight: float,
    compressor: Compressor,
    reducer: Reducer,
    base: Envelope,
    digest: bytes,
    deadline: float,
    seen: set[str],
    flagged: set[str],
) -> tuple[dict[int, bytes], list[Future[None]]]:
    """Reduce partition ``j`` as its verifier; send each chunk's digest to every other member.

    Rows are ordered as the primary orders them: its own first, then the others in member order.

    Returns:
        ``({chunk: digest}, sends)``.
    """
    me = group.index
    owner = group.members[j]
    others = [p for p in group.members if p != coll.peer_id]
    order = [owner] + [p for p in group.members if p != owner]
    out: dict[int, bytes] = {}
    sends: list[Future[None]] = []
    agg_codec = aggregate_codec(compressor)
    excluded: set[str] = set()
    for c, (a, b) in enumerate(chunks):
        got = coll._wait_keys(group, base.kind, [("vpart", p, c) for p in others], digest, deadline)
        rows, weights, who = [], [], []
        for p in order:
            if p == coll.peer_id:
                rows.append(coll._decode_chunk(compressor, (own_frames[(j, c)],), b - a))
                weights.append(weight)
                who.append(p)
                continue
            if p in excluded:
                continue
            d = got[("vpart", p, c)]
            try:
                if d.env.index != j or d.env.numel != base.numel:
                    raise ProtocolError("part for another partition or layout")
                rows.append(coll._decode_chunk(compressor, d.frames, b - a))
                weights.append(d.env.weight)
                who.append(p)
            except (ProtocolError, ValueError, RuntimeError) as e:
                excluded.add(p)
                logger.warning(
                    "round %d: verified contribution of %s left out: %s", group.round_id, p[:12], e
                )
        stack = torch.stack(rows)
        agg = fit_reducer(reducer, len(rows)).reduce(stack, torch.tensor(weights, dtype=torch.float32))
        flag_rows(stack, agg, who, seen, flagged)
        frame = encode_aggregate(agg_codec, agg, base.kind, group.size, j, c)
        out[c] = chunk_digest(frame)
        env = replace(base, type="vdig", index=j, chunk=c, frames=1, nbytes=32, weight=0.0)
        sends += [coll._send(p, env, [out[c]], deadline) for p in others]
    del me
    return out, sends


def check_aggregates(
    coll: Any,
    group: Group,
    chunks: list[list[tuple[int, int]]],
    aggs: dict[Any, Any],
    own_frames: dict[tuple[int, int], bytes],
    my_digests: dict[tuple[int, int], bytes],
    kind: str,
    digest: bytes,
    deadline: float,
) -> None:
    """Compare the hash of every primary's aggregate bytes (as this peer received them) with its
    verifier's digest.

    Raises:
        OwnerCheckFailed: one or more partitions differ (after recording them with the guard).
    """
    n, r = group.size, group.round_id
    agg_frames = {(group.members.index(k[1]), k[2]): d.frames[0] for k, d in aggs.items()}
    agg_frames.update(
        {(group.index, c): own_frames[(-1 - group.index, c)] for c in range(len(chunks[group.index]))}
    )
    keys = []
    for i in range(n):
        v = verifier_index(n, i, r)
        if v != group.index:
            keys += [("vdig", group.members[v], c) for c in range(len(chunks[i]))]
    got = coll._wait_keys(group, kind, keys, digest, deadline)
    bad: list[tuple[str, str]] = []
    for i in range(n):
        v = verifier_index(n, i, r)
        for c in range(len(chunks[i])):
            if v == group.index:
                expected = my_digests[(i, c)]
            else:
                d = got[("vdig", group.members[v], c)]
                expected = d.frames[0] if len(d.frames) == 1 and d.env.index == i else b""
            if chunk_digest(agg_frames[(i, c)]) != expected:
                pair = (group.members[i], group.members[v])
                if pair not in bad:
                    bad.append(pair)
    if bad:
        coll.guard.owner_failed(r, bad)
        raise OwnerCheckFailed(
            f"owner check failed for {[(p[:8], v[:8]) for p, v in bad]} (primary, verifier)", bad
        )
