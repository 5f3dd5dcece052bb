"""The start gate of a fixed-size run (``simulate``): its peers take their first step together.

``simulate`` starts every peer at once, but on one busy machine their start-ups (DHT node, p2pd,
model and data) queue for the same cores: 16 peers on 2 cores began training 21 s apart, and since a
round comes every ``H`` steps, each peer reached every round as far behind the first as it started.
With a 3 s join window 40 of 48 peer-rounds were late. A peer of a fixed-size run therefore waits,
before its first step, until the run's ``n`` trainers say in their records that they are ready (a
record goes up with the node, seconds before the model and data are: ``READY``), polling the DHT;
a peer that never comes up costs the others :data:`START_GATE_S` at most (the parent reports its
death meanwhile). Restarted peers, which join a run under way, do not wait.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from swarmtrain.core.errors import SwarmError

__all__ = ["POLL_S", "READY", "START_GATE_S", "start_together"]

logger = logging.getLogger(__name__)

#: the longest wait for the others: a hang guard, well above the start-up of 32 peers on 2 cores
START_GATE_S = 300.0
#: seconds between looks at the run's peer records
POLL_S = 0.25
#: the record field (``extra``) a peer sets to 1 once it could take its first step
READY = "ready"


def _trainers_up(node: Any) -> int:
    try:
        records = node.live_peers(timeout=10.0)
    except SwarmError:  # a DHT read that timed out: look again
        return 0
    return sum(1 for r in records if r.role == "trainer" and r.extra.get(READY) == 1)


def start_together(node: Any, n_peers: int, stop: Any, timeout: float = START_GATE_S) -> float:
    """Say this peer is ready, then wait until ``n_peers`` trainers of this node's run are, ``stop``
    is requested, or ``timeout`` passed; returns the seconds waited."""
    t0 = time.monotonic()
    node.publish(**{READY: 1})
    up = _trainers_up(node)
    if up < n_peers:
        logger.info("waiting for the run's %d peers to start (%d ready)", n_peers, up)
    while up < n_peers and not stop.requested:
        if time.monotonic() - t0 >= timeout:
            logger.warning("%d of the run's %d peers ready after %.0f s: starting", up, n_peers, timeout)
            break
        stop.wait(POLL_S)
        up = _trainers_up(node)
    return time.monotonic() - t0
