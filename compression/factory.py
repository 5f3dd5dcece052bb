"""Build codecs from names and config, and decode a packet with the codec its name says.

Names are the ``CODECS`` registry names plus the composites ``topk+<value codec>`` (``topk`` alone
keeps raw values). The same words work in TOML config, on the command line and on the wire.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from compression.base import CODECS, Codec
from compression.blockwise import BlockwiseCodec
from compression.feedback import EF21, ErrorFeedback
from compression.ternary import TernaryCompressor
from compression.topk import TopKCompressor
from swarmtrain.core.config import CompressionConfig
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.packet import Packet

__all__ = ["build_compressor", "make_codec", "codec_names", "decompress_any", "VALUE_CODECS"]

#: codecs that may carry top-k values.
VALUE_CODECS = ("bf16", "fp16", "int4", "int8", "none", "ternary")


def codec_names() -> list[str]:
    """Every codec name a packet may carry: the registry's plus ``topk+<value codec>``."""
    names = set(CODECS.names())
    names.update(f"topk+{v}" for v in VALUE_CODECS if v != "none")
    return sorted(names)


def make_codec(
    name: str,
    *,
    block: int = 256,
    k: int | None = None,
    fraction: float = 0.01,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> Codec:
    """Instantiate the codec ``name`` (e.g. ``"int8"``, ``"topk+int8"``).

    Args:
        name: a name from ``codec_names()`` (``"topk+none"`` is accepted as ``"topk"``).
        block: block size of ``int8``/``int4``/``ternary``.
        k: top-k count (takes precedence over ``fraction``).
        fraction: top-k fraction when ``k`` is not given.
        seed: ternary's random seed.
        device: where decoded tensors are put.

    Raises:
        ConfigError: unknown name or invalid parameter.
    """
    if not isinstance(name, str):
        raise ConfigError(f"codec name must be a string, got {name!r}")
    head, plus, tail = name.partition("+")
    if head == "topk":
        inner_name = tail if plus else "none"
        if inner_name not in VALUE_CODECS:
            raise ConfigError(f"unknown codec {name!r}: topk values use one of {', '.join(VALUE_CODECS)}")
        inner = make_codec(inner_name, block=block, seed=seed, device=device)
        if k is not None:
            return TopKCompressor(k=k, inner=inner, device=device)
        return TopKCompressor(fraction=fraction, inner=inner, device=device)
    if plus:
        raise ConfigError(f"unknown codec {name!r}: only topk composes ('topk+int8')")
    cls = CODECS.get(name)
    factory: Callable[..., Codec] = cls
    if issubclass(cls, BlockwiseCodec):
        return factory(block=block, device=device)
    if issubclass(cls, TernaryCompressor):
        return factory(block=block, seed=seed, device=device)
    return factory(device=device)


def build_compressor(
    cfg: CompressionConfig, *, seed: int = 0, device: str | torch.device | None = None
) -> Codec:
    """The compressor a strategy sends through, from its ``[compression]`` config.

    ``cfg.codec`` names the codec, ``cfg.block_size`` and ``cfg.topk_fraction`` parametrise it, and
    ``cfg.error_feedback`` (``"ef"`` or ``"ef21"``) wraps it in ``ErrorFeedback`` or ``EF21``.

    Raises:
        ConfigError: unknown codec name or invalid parameter.
    """
    codec = make_codec(cfg.codec, block=cfg.block_size, fraction=cfg.topk_fraction, seed=seed, device=device)
    if cfg.error_feedback == "ef":
        return ErrorFeedback(codec)
    if cfg.error_feedback == "ef21":
        return EF21(codec)
    return codec


_DECODERS: dict[tuple[str, str], Codec] = {}
_LOCK = threading.Lock()


def decompress_any(p: Packet, *, device: str | torch.device | None = None) -> torch.Tensor:
    """Decode ``p`` with the codec its ``codec`` field names (for receivers of untrusted packets).

    Raises:
        ProtocolError: unknown codec name or an inconsistent packet.
    """
    if not isinstance(p, Packet) or not isinstance(p.codec, str):
        raise ProtocolError("expected a Packet")
    dev = str(torch.device(device)) if device is not None else "cpu"
    with _LOCK:
        codec = _DECODERS.get((p.codec, dev))
        if codec is None:
            if p.codec not in codec_names():
                raise ProtocolError(f"unknown codec {p.codec[:40]!r}")
            # block/k only shape encoders; decoders read them from the packet.
            codec = _DECODERS[(p.codec, dev)] = make_codec(p.codec, device=dev)
    return codec.decompress(p)
