"""What the fork server of :func:`peers.dht.process.process_context` imports once, for every process
it forks: torch, and ``torch._dynamo``, which torch's optimizers import on first use (about 68 MiB
of a process's own memory otherwise, for every peer). Then ``gc.freeze()``: the collector leaves
what was imported so far alone, so a forked peer's collections do not write to (and so copy) the
pages it shares with the fork server and with every other peer.

Nothing here starts a thread, an event loop or a CUDA context, or makes a process-shared lock (why
hivemind is not imported: see :data:`peers.dht.process.FORK_SERVER_PRELOAD`).
"""

from __future__ import annotations

import gc

import torch
import torch._dynamo  # noqa: F401  (imported for its pages: see the module docstring)

__all__: list[str] = []

del torch
gc.freeze()
