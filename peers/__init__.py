"""Everything that crosses the network: DHT node, rounds, collectives, robust reducers, SWARM.

Public API of the networking core: :class:`PeerNode` (DHT + peer record heartbeat),
:class:`P2PCollective` (butterfly all-reduce / all-gather over P2P streams), :class:`ByteLedger`,
state download (:class:`StateServer`, :func:`download_state`) and process lifecycle helpers.
Names are imported lazily so that ``import peers.reducers`` stays light (no hivemind import).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# hivemind defaults torch to the "file_system" sharing strategy, whose torch_shm_manager daemon sits
# in the peer's process group: a Ctrl-C or a group SIGTERM kills it, and every later hivemind call
# (each creates a shared-memory future) then spins forever inside torch. "file_descriptor" needs no
# daemon. Set before hivemind is first imported; an explicit user setting wins.
os.environ.setdefault("HIVEMIND_MEMORY_SHARING_STRATEGY", "file_descriptor")

__all__ = [
    "PeerNode",
    "PeerRecord",
    "P2PCollective",
    "ByteLedger",
    "StateServer",
    "download_state",
    "GracefulExit",
    "PeerProcess",
    "spawn_function",
    "process_context",
    "spawn_command",
    "kill_group",
    "find_orphans",
    "ensure_identity",
]

_LAZY = {
    "PeerNode": "peers.dht.node",
    "PeerRecord": "peers.dht.records",
    "P2PCollective": "peers.rounds.collective",
    "ByteLedger": "peers.wire.ledger",
    "StateServer": "peers.state.state_transfer",
    "download_state": "peers.state.state_transfer",
    "GracefulExit": "peers.dht.process",
    "PeerProcess": "peers.dht.process",
    "spawn_function": "peers.dht.process",
    "process_context": "peers.dht.process",
    "spawn_command": "peers.dht.process",
    "kill_group": "peers.dht.process",
    "find_orphans": "peers.dht.process",
    "ensure_identity": "peers.keys.identity",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'peers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
