"""Build codecs from names and config, and decode a packet with the codec its name says.

Names are the ``CODECS`` registry names plus the composites ``topk+<value codec>`` (``topk`` alone
keeps raw values). The same words work in TOML config, on the command line and on the wire, and the
registry is their only source: the wire allow-list, ``VALUE_CODECS``, ``codec_names()`` and the
benchmark's default list are all derived from it, so a codec (or a plugin's, ``compression.plugins``)
is added by registering it once. Codec options are the codec class's constructor arguments, set from
one dict (``compression.options``).
"""

from __future__ import annotations

import hashlib
import inspect
import threading
from collections.abc import Mapping
from typing import Any

import torch

from compression.base import CODECS, Codec
from compression.feedback import EF21, ErrorFeedback
from swarmtrain.core.config import CompressionConfig
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.packet import Packet
from swarmtrain.core.registry import NamesView

__all__ = ["build_compressor", "make_codec", "codec_names", "decompress_any", "peer_seed", "VALUE_CODECS"]

#: codecs that may carry top-k values (``value_codec = True``), live from the registry.
VALUE_CODECS: NamesView = NamesView(CODECS.value_names, ordered=True)

#: constructor arguments that are not codec options (set by the caller, not by config).
_RESERVED = frozenset({"self", "device", "inner"})

OptionValue = int | float | str | bool


def codec_names() -> list[str]:
    """Every codec name a packet may carry: the registry's names and their composites (``topk+int8``)."""
    return sorted(CODECS.wire_names())


def _accepted(cls: type) -> list[str]:
    """Keyword arguments of ``cls``'s constructor that options may set."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.name not in _RESERVED]


def _construct(
    name: str, defaults: Mapping[str, Any], options: Mapping[str, Any], device: str | torch.device | None
) -> Codec:
    """``CODECS[name]`` built from ``defaults`` (dropped where the constructor lacks them) overridden by
    ``options`` (an error where it lacks them)."""
    cls = CODECS.get(name)
    accepted = _accepted(cls)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        which = ", ".join(accepted) or "none"
        raise ConfigError(f"codec {name!r} has no option {', '.join(map(repr, unknown))} (accepted: {which})")
    kwargs = {k: v for k, v in defaults.items() if k in accepted}
    kwargs.update(options)
    try:
        codec = cls(**kwargs, device=device)
    except TypeError as e:
        raise ConfigError(f"codec {name!r}: {e}") from None
    if not isinstance(codec, Codec) or codec.name != name:
        raise ConfigError(
            f"codec {name!r} built a {type(codec).__name__} named {getattr(codec, 'name', None)!r}"
        )
    return codec


def make_codec(
    name: str,
    *,
    block: int = 256,
    k: int | None = None,
    fraction: float = 0.01,
    seed: int = 0,
    device: str | torch.device | None = None,
    options: Mapping[str, OptionValue] | None = None,
) -> Codec:
    """Instantiate the codec ``name`` (e.g. ``"int8"``, ``"topk+int8"``).

    Args:
        name: a name from ``codec_names()`` (``"topk+none"`` is accepted as ``"topk"``).
        block: block size of ``int8``/``int4``/``ternary`` (a default: ``options`` override it).
        k: top-k count (takes precedence over ``fraction``).
        fraction: top-k fraction when ``k`` is not given.
        seed: ternary's random seed.
        device: where decoded tensors are put.
        options: constructor keyword arguments of the codec (``compression.options`` in config):
            any argument its class takes except ``device``/``inner``, e.g. ``{"block": 64}``; for
            ``topk+<codec>``, top-k's own (``k``, ``fraction``) go to top-k, the rest to the value
            codec. Plugin codecs take theirs the same way.

    Raises:
        ConfigError: unknown name, an option the codec does not take, or an invalid value.
    """
    if not isinstance(name, str):
        raise ConfigError(f"codec name must be a string, got {name!r}")
    opts = dict(options or {})
    bad = sorted(set(opts) & _RESERVED)
    if bad:
        raise ConfigError(f"codec option(s) {', '.join(map(repr, bad))} cannot be set from config")
    defaults: dict[str, Any] = {"block": block, "seed": seed}
    head, plus, tail = name.partition("+")
    if head == "topk" and "topk" in CODECS:
        inner_name = tail if plus else "none"
        if inner_name not in VALUE_CODECS:
            raise ConfigError(f"unknown codec {name!r}: topk values use one of {', '.join(VALUE_CODECS)}")
        own = set(_accepted(CODECS.get("topk")))
        top = {key: v for key, v in opts.items() if key in own}
        inner = _construct(
            inner_name, defaults, {key: v for key, v in opts.items() if key not in own}, device
        )
        if "k" not in top and "fraction" not in top:
            top = {"k": k} if k is not None else {"fraction": fraction}
        return _topk(top, inner, device)
    if plus:
        raise ConfigError(f"unknown codec {name!r}: only topk composes ('topk+int8')")
    return _construct(name, defaults, opts, device)


def _topk(top: Mapping[str, Any], inner: Codec, device: str | torch.device | None) -> Codec:
    """The registered top-k class around ``inner`` (``top``: its own options, already checked)."""
    cls = CODECS.get("topk")
    try:
        codec: Codec = cls(**top, inner=inner, device=device)
    except TypeError as e:
        raise ConfigError(f"codec 'topk': {e}") from None
    return codec


def peer_seed(run_seed: int, peer: int | str) -> int:
    """The seed of one peer's codec draws in a run whose codec seed is ``run_seed``.

    ``peer`` is the peer's identity: its rank in a fixed run, or its libp2p peer ID (``str``) where it
    has no rank. The result is the first 4 bytes (little-endian, so in ``[0, 2**32)``) of BLAKE2b
    over ``"<run_seed>/<kind>:<peer>"``: deterministic, the same on every machine, and different
    per peer, so random-draw codecs (ternary) quantise independently on each peer and their noise
    averages out instead of adding up coherently.
    """
    kind = "rank" if isinstance(peer, int) else "id"
    digest = hashlib.blake2b(f"{int(run_seed)}/{kind}:{peer}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def build_compressor(
    cfg: CompressionConfig,
    *,
    seed: int = 0,
    peer: int | str | None = None,
    device: str | torch.device | None = None,
    options: Mapping[str, OptionValue] | None = None,
) -> Codec:
    """The compressor a strategy sends through, from its ``[compression]`` config.

    ``cfg.codec`` names the codec, ``cfg.block_size`` and ``cfg.topk_fraction`` parametrise it,
    ``cfg.options`` (when the config has it; ``options`` here overrides it) sets any constructor
    option of the codec (see ``make_codec``), and ``cfg.error_feedback`` (``"ef"`` or ``"ef21"``)
    wraps it in ``ErrorFeedback`` or ``EF21``.

    Seeds: without ``peer`` the codec's seed is ``options``' ``seed`` or else ``seed`` (as before).
    With ``peer`` (this peer's rank or peer ID) that value is the run's codec seed and the codec gets
    ``peer_seed(run seed, peer)``: every peer of a run draws differently, reproducibly.

    Raises:
        ConfigError: unknown codec name or invalid parameter.
    """
    opts = dict(getattr(cfg, "options", None) or {}) if options is None else dict(options)
    if peer is not None:
        given = opts.get("seed")
        if isinstance(given, int) and not isinstance(given, bool):
            # kept in the options, so a codec without a seed still refuses it
            opts["seed"] = peer_seed(given, peer)
        else:
            seed = peer_seed(seed, peer)
    codec = make_codec(
        cfg.codec, block=cfg.block_size, fraction=cfg.topk_fraction, seed=seed, device=device, options=opts
    )
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
