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
    "Trainer": "swarmtrain.trainer",
    "StepInfo": "swarmtrain.trainer",
    "TrainResult": "swarmtrain.trainer",
    "GPT": "swarmtrain.models",
    "build_model": "swarmtrain.models",
    "PRESETS": "swarmtrain.models",
    "Corpus": "swarmtrain.data",
    "build_corpus": "swarmtrain.data",
    "BatchSampler": "swarmtrain.data",
    "pack_state": "swarmtrain.checkpoint",
    "unpack_state": "swarmtrain.checkpoint",
    "run_simulation": "swarmtrain.simulate",
    "SimulationResult": "swarmtrain.simulate",
    "run_volunteer": "swarmtrain.volunteer",
    "encode_packet": "swarmtrain.wire",
    "decode_packet": "swarmtrain.wire",
    "packet_nbytes": "swarmtrain.wire",
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
    "PeerNode": "peers.node",
    "P2PCollective": "peers.collective",
    "ByteLedger": "peers.ledger",
    "StateServer": "peers.state_transfer",
    "download_state": "peers.state_transfer",
    "REDUCERS": "peers.reducers",
    "build_reducer": "peers.reducers",
    "CenteredClip": "peers.reducers",
    "CoordinateMedian": "peers.reducers",
    "TrimmedMean": "peers.reducers",
    "Krum": "peers.reducers",
    "MultiKrum": "peers.reducers",
    "GeometricMedian": "peers.reducers",
    "MeanReducer": "peers.reducers",
    "ATTACKS": "peers.attacks",
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
    from swarmtrain.cli import run

    return run(["join", *(argv or [])])


def __dir__() -> list[str]:
    return sorted(__all__)
