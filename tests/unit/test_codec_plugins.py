"""Issue 16, defect 5: the codec registry is the single source of codec names.

A codec registered once (in code, or by an installed distribution through the ``swarmtrain.codecs``
entry-point group) is buildable by name, allowed on the wire, listed by the benchmark and usable as a
top-k value codec; codec options come from one dict. Names from peers are still checked against the
allow-list.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import compression
from compression.base import CODECS, Codec, buffer_tensor, check_packet, dtype_name
from compression.benchmark import DEFAULT_CODECS
from compression.plugins import ENTRY_POINT_GROUP, load_codec_plugins
from swarmtrain.core.config import CompressionConfig
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.packet import Packet
from swarmtrain.core.wire import WIRE_CODECS, decode_packet, encode_packet


class Half8Codec(Codec):
    """A toy third-party codec: fp32 values halved on the wire (tests only)."""

    name = "half8"
    value_codec = True

    def __init__(self, gain: float = 0.5, device: str | torch.device | None = None) -> None:
        super().__init__(device)
        if not 0 < gain <= 1:
            raise ConfigError(f"codec 'half8': gain must lie in (0, 1], got {gain}")
        self.gain = float(gain)

    def payload_nbytes(self, numel: int, dtype: str = "float32") -> int:
        return 4 * numel

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        dtype = dtype_name(t, self.name)
        arr = (t.detach().float().cpu() * self.gain).numpy().astype("<f4")
        return Packet(self.name, tuple(t.shape), dtype, (arr.tobytes(),), (("gain", self.gain),))

    def decompress(self, p: Packet) -> torch.Tensor:
        check_packet(p, self.name, 1)
        gain = p.param("gain")
        if not isinstance(gain, float) or not 0 < gain <= 1:
            raise ProtocolError("half8: bad gain")
        flat = buffer_tensor(p.buffers[0], torch.float32, p.numel, "half8 values") / gain
        return self._out(flat, p)


NotACodec = object()


def _broken() -> None:  # pragma: no cover - the entry point's target is this module attribute
    raise RuntimeError("never loaded")


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[importlib.metadata.EntryPoint]]:
    """Installed entry points of the ``swarmtrain.codecs`` group, as a fake distribution declares them."""
    eps: list[importlib.metadata.EntryPoint] = []

    def entry_points(**kw: Any) -> list[importlib.metadata.EntryPoint]:
        return [ep for ep in eps if ep.group == kw.get("group")]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    before = set(CODECS.names())
    yield eps
    for name in set(CODECS.names()) - before:
        CODECS.unregister(name)


def _ep(name: str, target: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=f"{__name__}:{target}", group=ENTRY_POINT_GROUP)


def test_entry_point_codec_is_usable_and_allowed_on_the_wire(
    plugins: list[importlib.metadata.EntryPoint], caplog: pytest.LogCaptureFixture
) -> None:
    assert "half8" not in WIRE_CODECS
    plugins += [_ep("half8", "Half8Codec"), _ep("bogus", "NotACodec"), _ep("broken", "missing_attr")]
    with caplog.at_level(logging.WARNING, logger="compression.plugins"):
        assert load_codec_plugins() == ["half8"]
    assert "bogus" in caplog.text and "broken" in caplog.text  # one warning each, no crash
    assert "half8" in compression.codec_names() and "topk+half8" in compression.codec_names()
    assert "half8" in WIRE_CODECS and "topk+half8" in WIRE_CODECS  # the allow-list follows
    assert "half8" in DEFAULT_CODECS  # the benchmark lists it
    codec = compression.build_compressor(CompressionConfig(codec="half8"))
    x = torch.randn(10)
    data = encode_packet(codec.compress(x))
    assert torch.equal(compression.decompress_any(decode_packet(data)), x)
    topk = compression.make_codec("topk+half8", k=3)
    assert int((topk.decompress(decode_packet(encode_packet(topk.compress(x)))) != 0).sum()) == 3
    ef = compression.build_compressor(CompressionConfig(codec="half8", error_feedback="ef"))
    ef.compress(x, key="w")
    assert load_codec_plugins() == []  # loading twice registers nothing new


def test_codec_names_from_peers_are_still_checked() -> None:
    bad = encode_packet(Packet("evil", (1,), "float32", (b"\0" * 4,)))
    with pytest.raises(ProtocolError, match="not allowed"):
        decode_packet(bad)
    with pytest.raises(ProtocolError, match="unknown codec"):
        compression.decompress_any(Packet("evil", (1,), "float32", (b"\0" * 4,)))
    with pytest.raises(ProtocolError, match="unknown codec"):
        compression.decompress_any(Packet("topk+topk", (1,), "float32", (b"\0" * 4,)))


def test_allow_list_is_derived_from_the_registry() -> None:
    assert set(WIRE_CODECS) == set(compression.codec_names())
    with pytest.raises(ConfigError, match="name"):
        CODECS.register("topk+x")(Half8Codec)  # '+' is reserved for composites
    with pytest.raises(ConfigError, match="name"):
        CODECS.register("x" * 65)(Half8Codec)


def test_codec_options_come_from_one_dict() -> None:
    c = compression.build_compressor(CompressionConfig(codec="int8"), options={"block": 64})
    assert isinstance(c, compression.Int8Compressor) and c.block == 64
    t = compression.make_codec("topk+ternary", options={"k": 3, "block": 32, "seed": 9})
    assert isinstance(t, compression.TopKCompressor) and t.k == 3
    assert isinstance(t.inner, compression.TernaryCompressor) and t.inner.block == 32 and t.inner.seed == 9
    with pytest.raises(ConfigError, match="accepted: block"):
        compression.make_codec("int8", options={"blok": 64})
    with pytest.raises(ConfigError, match="device"):
        compression.make_codec("int8", options={"device": "cuda"})
    with pytest.raises(ConfigError, match="block"):
        compression.make_codec("int8", options={"block": 7})
    assert np.isclose(compression.make_codec("topk", options={"fraction": 0.5}).fraction or 0, 0.5)
