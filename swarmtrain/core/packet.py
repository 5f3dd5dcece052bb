"""The unit a codec produces and the wire carries: a compressed tensor.

A ``Packet`` holds only plain data (strings, ints, floats, bytes) so that ``swarmtrain.core.wire`` can
serialise it with msgpack and validate every field on the way back in. Decoding the same packet
must give a bit-identical tensor on every peer and device.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Packet", "ParamValue"]

ParamValue = int | float | str | bool


@dataclass(frozen=True)
class Packet:
    """A compressed tensor.

    Attributes:
        codec: registry name of the codec that made it (e.g. ``"int8"``, ``"topk+int8"``).
        shape: shape of the decoded tensor.
        dtype: torch dtype name of the decoded tensor (``"float32"``, ``"float16"``, ``"bfloat16"``).
        buffers: the payload, codec-defined byte strings.
        params: small codec parameters needed to decode (block size, k, ...), sorted by key.
    """

    codec: str
    shape: tuple[int, ...]
    dtype: str
    buffers: tuple[bytes, ...]
    params: tuple[tuple[str, ParamValue], ...] = field(default=())

    @property
    def numel(self) -> int:
        """Number of elements of the decoded tensor."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def payload_nbytes(self) -> int:
        """Bytes of the payload buffers alone (the wire adds a small header: see ``wire.packet_nbytes``)."""
        return sum(len(b) for b in self.buffers)

    def param(self, key: str) -> ParamValue:
        """The codec parameter ``key``; ``KeyError`` if absent (decoders turn that into ProtocolError)."""
        for k, v in self.params:
            if k == key:
                return v
        raise KeyError(key)
