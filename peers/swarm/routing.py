"""Stochastic wiring (SWARM, Ryabinin et al. 2023, section 3.2): which server of a stage serves a
micro-batch.

Each micro-batch picks one server per stage at random, with probability proportional to the rate
at which that server is expected to finish new work: its announced throughput divided by one plus
its announced queue length. Servers the caller has excluded (timed out, refused, failed) are never
picked. A server that has not measured its throughput yet is weighted like the median of those that
have, so a newcomer gets work (and so a measurement) without being flooded.

Pure: no network, no clock; the caller passes the random generator.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from swarmtrain.core.errors import ProtocolError

__all__ = ["ServerInfo", "server_from_record", "route_weight", "pick_server", "servers_by_stage"]

MAX_QUEUE_ANNOUNCED = 1 << 20


@dataclass(frozen=True)
class ServerInfo:
    """What a stage server announces about itself.

    Attributes:
        peer_id: the server's libp2p peer ID.
        stage: the stage it serves.
        throughput: measured samples per second it served (0: not measured yet).
        queue: requests waiting or running on it.
        version: optimizer steps it has applied (its parameters' version).
        syncing: catching up with its stage (``peers.swarm.steps``): it takes the stage's step
            closes but no micro-batches yet.
    """

    peer_id: str
    stage: int
    throughput: float = 0.0
    queue: int = 0
    version: int = 0
    syncing: bool = False


def server_from_record(
    peer_id: str, role: str, throughput: float, extra: Mapping[str, Any], stages: int
) -> ServerInfo | None:
    """A :class:`ServerInfo` from a peer record's fields, or ``None`` when the record is not a
    server's of this pipeline.

    Raises:
        ProtocolError: a server record with out-of-range fields (the caller skips it).
    """
    if role != "server":
        return None
    stage, queue, version = extra.get("stage"), extra.get("queue", 0), extra.get("ver", 0)
    syncing = extra.get("sync", 0)
    if type(stage) is not int or type(queue) is not int or type(version) is not int:
        raise ProtocolError("server record fields stage, queue and ver must be ints")
    if type(syncing) is not int or syncing not in (0, 1):
        raise ProtocolError("server record field sync must be 0 or 1")
    if not 0 <= stage < stages:
        raise ProtocolError(f"server announces stage {stage} outside [0, {stages})")
    if not 0 <= queue <= MAX_QUEUE_ANNOUNCED or version < 0:
        raise ProtocolError("server announces a queue or version out of range")
    if not math.isfinite(throughput) or throughput < 0:
        raise ProtocolError("server announces a throughput that is not finite and >= 0")
    return ServerInfo(peer_id, stage, float(throughput), queue, version, bool(syncing))


def servers_by_stage(servers: Iterable[ServerInfo], stages: int) -> list[list[ServerInfo]]:
    """Servers grouped by stage (index = stage), each list sorted by peer ID."""
    out: list[list[ServerInfo]] = [[] for _ in range(stages)]
    for s in servers:
        if 0 <= s.stage < stages:
            out[s.stage].append(s)
    return [sorted(x, key=lambda s: s.peer_id) for x in out]


def route_weight(s: ServerInfo, default_throughput: float) -> float:
    """Expected rate at which ``s`` finishes a new request: throughput / (1 + queue)."""
    tp = s.throughput if s.throughput > 0 else default_throughput
    return max(tp, 1e-9) / (1.0 + s.queue)


def pick_server(
    candidates: Iterable[ServerInfo], excluded: Collection[str], rng: random.Random
) -> ServerInfo | None:
    """One server drawn with probability proportional to :func:`route_weight`, or ``None`` when
    every candidate is excluded or catching up (or there is none)."""
    pool = [s for s in candidates if s.peer_id not in excluded and not s.syncing]
    if not pool:
        return None
    measured = [s.throughput for s in pool if s.throughput > 0]
    default = statistics.median(measured) if measured else 1.0
    weights = [route_weight(s, default) for s in pool]
    return rng.choices(pool, weights=weights, k=1)[0]
