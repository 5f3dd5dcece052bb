"""swarmtrain: train one model across many poorly connected machines.

The public API is re-exported here lazily (PEP 562), so ``import swarmtrain`` stays cheap and never
pulls in hivemind unless a networked symbol is used: ``from swarmtrain import DiLoCo, Int8Compressor``.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "SwarmError": "swarmtrain.errors",
    "ConfigError": "swarmtrain.errors",
    "PeerTimeoutError": "swarmtrain.errors",
    "ProtocolError": "swarmtrain.errors",
    "UpdateRejected": "swarmtrain.errors",
    "Config": "swarmtrain.config",
    "load_config": "swarmtrain.config",
    "Packet": "swarmtrain.packet",
    "Registry": "swarmtrain.registry",
    "Compressor": "swarmtrain.protocols",
    "Reducer": "swarmtrain.protocols",
    "Collective": "swarmtrain.protocols",
    "Strategy": "swarmtrain.protocols",
    "RoundResult": "swarmtrain.protocols",
    "GatherResult": "swarmtrain.protocols",
    "StepReport": "swarmtrain.protocols",
}

__all__ = ["__version__", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swarmtrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
