"""swarmtrain: train one model across many poorly connected machines.

The public API is re-exported here lazily (PEP 562), so ``import swarmtrain`` stays cheap and never
pulls in hivemind unless a networked symbol is used: ``from swarmtrain import DiLoCo, Int8Compressor``.
"""

from __future__ import annotations

import importlib
from typing import Any

from swarmtrain.core import __version__

# public name -> module that defines it
_LAZY: dict[str, str] = {
    "SwarmError": "swarmtrain.core.errors",
    "ConfigError": "swarmtrain.core.errors",
    "PeerTimeoutError": "swarmtrain.core.errors",
    "ProtocolError": "swarmtrain.core.errors",
    "UpdateRejected": "swarmtrain.core.errors",
    "Config": "swarmtrain.core.config",
    "load_config": "swarmtrain.core.config",
    "Packet": "swarmtrain.core.packet",
    "Registry": "swarmtrain.core.registry",
    "Compressor": "swarmtrain.core.protocols",
    "Reducer": "swarmtrain.core.protocols",
    "Collective": "swarmtrain.core.protocols",
    "Strategy": "swarmtrain.core.protocols",
    "RoundResult": "swarmtrain.core.protocols",
    "GatherResult": "swarmtrain.core.protocols",
    "StepReport": "swarmtrain.core.protocols",
    "Trainer": "swarmtrain.app.train.trainer",
    "StepInfo": "swarmtrain.app.train.trainer",
    "TrainResult": "swarmtrain.app.train.trainer",
    "GPT": "swarmtrain.app.models",
    "build_model": "swarmtrain.app.models",
    "PRESETS": "swarmtrain.app.models",
    "Corpus": "swarmtrain.app.data",
    "build_corpus": "swarmtrain.app.data",
    "BatchSampler": "swarmtrain.app.data",
    "pack_state": "swarmtrain.app.train.checkpoint",
    "unpack_state": "swarmtrain.app.train.checkpoint",
    "run_simulation": "swarmtrain.simulation.runner",
    "SimulationResult": "swarmtrain.simulation.runner",
    "run_volunteer": "swarmtrain.app.peer.volunteer",
    "connect": "swarmtrain.app.peer.connect",
    "SwarmPeer": "swarmtrain.app.peer.connect",
    "encode_packet": "swarmtrain.core.wire",
    "decode_packet": "swarmtrain.core.wire",
    "packet_nbytes": "swarmtrain.core.wire",
    "CODECS": "compression",
    "build_compressor": "compression",
    "NoneCompressor": "compression",
    "FP16Compressor": "compression",
    "BF16Compressor": "compression",
    "Int8Compressor": "compression",
    "Int4Compressor": "compression",
    "TernaryCompressor": "compression",
    "TopKCompressor": "compression",
    "ErrorFeedback": "compression",
    "EF21": "compression",
    "STRATEGIES": "optimizers",
    "StrategyContext": "optimizers",
    "build_strategy": "optimizers",
    "Local": "optimizers",
    "DataParallel": "optimizers.data_parallel",
    "DiLoCo": "optimizers.diloco",
    "StreamingDiLoCo": "optimizers.streaming_diloco",
    "DeMo": "optimizers.demo",
    "InProcessGroup": "optimizers.inprocess",
    "PeerNode": "peers.dht.node",
    "P2PCollective": "peers.rounds.collective",
    "ByteLedger": "peers.wire.ledger",
    "spawn_function": "peers.dht.process",
    "StateServer": "peers.state.state_transfer",
    "download_state": "peers.state.state_transfer",
    "REDUCERS": "peers.reducers",
    "build_reducer": "peers.reducers",
    "CenteredClip": "peers.reducers",
    "CoordinateMedian": "peers.reducers",
    "TrimmedMean": "peers.reducers",
    "Krum": "peers.reducers",
    "MultiKrum": "peers.reducers",
    "GeometricMedian": "peers.reducers",
    "MeanReducer": "peers.reducers",
    "ATTACKS": "swarmtrain.simulation.attacks",
}

__all__ = ["__version__", "join", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swarmtrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def join(argv: list[str] | None = None) -> int:
    """Run ``swarmtrain join`` with CLI-style arguments (``join(["--initial-peers", maddr])``)."""
    from swarmtrain.app.cli import run

    return run(["join", *(argv or [])])


def __dir__() -> list[str]:
    return sorted(__all__)
