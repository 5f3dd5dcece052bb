"""Entry point of one process of ``benchmarks/wan_overlap.py``, started inside a network namespace.

::

    ip netns exec swt-n0 python benchmarks/wan_worker.py bootstrap CONFIG.json
    ip netns exec swt-n1 python benchmarks/wan_worker.py peer RANK N_PEERS CONFIG.json

It runs ``swarmtrain.simulation.runner``'s bootstrap / peer main functions unchanged; instead of a
multiprocessing queue (which cannot cross into a process started by ``ip netns exec``), their
messages go to stdout as one JSON line each, prefixed by ``MESSAGE_PREFIX``, for the parent to read.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["MESSAGE_PREFIX", "StdoutQueue", "main"]

MESSAGE_PREFIX = "@@swt "


class StdoutQueue:
    """The ``put`` half of a queue: each message becomes one JSON line on stdout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def put(self, msg: Any) -> None:
        line = MESSAGE_PREFIX + json.dumps(list(msg), default=str)
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def main(argv: list[str]) -> int:
    """``bootstrap CONFIG`` or ``peer RANK N CONFIG``."""
    from swarmtrain.simulation.runner import bootstrap_main, peer_main

    q = StdoutQueue()
    # SWARMTRAIN_WAN_LOG=WARNING shows the peers' warnings (e.g. why a round failed) on stderr
    level = getattr(logging, os.environ.get("SWARMTRAIN_WAN_LOG", "ERROR").upper(), logging.ERROR)
    if len(argv) == 2 and argv[0] == "bootstrap":
        bootstrap_main(Path(argv[1]).read_text(), q, level)
        return 0
    if len(argv) == 4 and argv[0] == "peer":
        peer_main(int(argv[1]), int(argv[2]), Path(argv[3]).read_text(), q, level)
        return 0
    sys.stderr.write("usage: wan_worker.py bootstrap CONFIG | peer RANK N CONFIG\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
