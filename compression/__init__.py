"""Tensor codecs: pure math, no network (docs/architecture.md, Layers).

Every codec is registered by name in ``CODECS`` (``none``, ``fp16``, ``bf16``, ``int8``, ``int4``,
``ternary``, ``topk``; composites ``topk+<codec>``) and implements ``swarmtrain.core.protocols.Compressor``:
``compress(t, *, key="") -> Packet`` and ``decompress(p) -> Tensor``. ``ErrorFeedback`` and ``EF21``
wrap any of them. Installed distributions add codecs through the ``swarmtrain.codecs`` entry-point
group (``compression.plugins``), loaded on import. ``swarmtrain.core.wire`` turns packets into bytes
and back; decoders treat packets as hostile and raise ``ProtocolError`` on any inconsistency.
"""

from __future__ import annotations

from compression.base import CODECS, DTYPES, Codec
from compression.blockwise import BlockwiseCodec, Int4Compressor, Int8Compressor
from compression.cast import BF16Compressor, FP16Compressor, NoneCompressor
from compression.factory import (
    VALUE_CODECS,
    build_compressor,
    codec_names,
    decompress_any,
    make_codec,
    peer_seed,
)
from compression.feedback import EF21, ErrorFeedback
from compression.kernels import compile_mode
from compression.plugins import ENTRY_POINT_GROUP, load_codec_plugins
from compression.ternary import TernaryCompressor
from compression.topk import TopKCompressor

__all__ = [
    "CODECS",
    "DTYPES",
    "VALUE_CODECS",
    "Codec",
    "BlockwiseCodec",
    "NoneCompressor",
    "FP16Compressor",
    "BF16Compressor",
    "Int8Compressor",
    "Int4Compressor",
    "TernaryCompressor",
    "TopKCompressor",
    "ErrorFeedback",
    "EF21",
    "build_compressor",
    "peer_seed",
    "make_codec",
    "codec_names",
    "decompress_any",
    "compile_mode",
    "load_codec_plugins",
    "ENTRY_POINT_GROUP",
]

load_codec_plugins()  # installed third-party codecs (entry points ``swarmtrain.codecs``)
