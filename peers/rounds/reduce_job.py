"""What one peer reduces in one all-reduce round: how the flat vector is cut, and how its parts and
aggregates are encoded.

:class:`Layout` cuts the concatenation of the tensors reduced into one partition per member and each
partition into chunks; :class:`ReduceJob` holds the round's codecs and reducer and encodes this peer's
parts and an owner's aggregates under keys that name *what* is compressed (the vector, by its tensors'
names and shapes), so a codec with memory (``swarmtrain.core.protocols.SpanCompressor``: error
feedback) keeps each element's memory whatever the group size. ``peers.rounds.butterfly`` moves the
encoded bytes between the members.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import torch

from compression.staging import compress_many
from peers.rounds.round_io import RoundIO
from peers.wire.messages import Envelope, encode_packet_bytes
from swarmtrain.core.protocols import Compressor, Reducer, RetainingCompressor, SpanCompressor

__all__ = ["Chunk", "bounds", "Layout", "ReduceJob"]

Chunk = tuple[int, int]  # [a, b) in the flat vector


def bounds(n_items: int, n_parts: int) -> list[tuple[int, int]]:
    """Contiguous near-equal ``[lo, hi)`` ranges; the first ``n_items % n_parts`` get one more."""
    base, extra = divmod(n_items, n_parts)
    out, lo = [], 0
    for i in range(n_parts):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


@dataclass(frozen=True)
class Layout:
    """How one all-reduce cuts its flat vector.

    Attributes:
        numel: elements of the flat vector.
        chunks: ``chunks[i][c]`` is the ``[a, b)`` range of chunk ``c`` of partition ``i`` (owned by
            member ``i``).
        digest: the group digest followed by 8 bytes of the tensor names and shapes; every data message
            of the round carries it, so a peer with another layout is refused.
    """

    numel: int
    chunks: list[list[Chunk]]
    digest: bytes

    @property
    def spec(self) -> str:
        """16 hex digits naming the tensors reduced (their names and shapes, in order), whatever the
        group: the identity of the flat vector, which error-feedback memory is keyed by."""
        return self.digest[-8:].hex()

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor], group_digest: bytes, n_parts: int, step: int) -> Layout:
        """The layout of ``tensors`` cut into ``n_parts`` partitions of chunks of ``step`` elements."""
        names = list(tensors)
        numel = sum(t.numel() for t in tensors.values())
        spec = hashlib.sha256(repr([(k, tuple(tensors[k].shape)) for k in names]).encode()).digest()[:8]
        chunks = [[(a, min(a + step, hi)) for a in range(lo, hi, step)] for lo, hi in bounds(numel, n_parts)]
        return cls(numel, chunks, group_digest + spec)


@dataclass(frozen=True)
class ReduceJob:
    """What one peer reduces in one round, as the butterfly and its verification step see it.

    Attributes:
        io: the round.
        layout: partitions and chunks.
        compressor: codec of the parts.
        agg_codec: codec of the aggregates.
        reducer: combines the rows of one chunk.
        weight: this peer's weight.
        device: where the reduction runs (the input's device); decoded rows are moved here once.
    """

    io: RoundIO
    layout: Layout
    compressor: Compressor
    agg_codec: Compressor
    reducer: Reducer
    weight: float
    device: torch.device = torch.device("cpu")

    def decode_row(self, frames: tuple[bytes, ...] | list[bytes], length: int) -> torch.Tensor:
        """One peer's encoded chunk decoded (on the codec's device, the host) and placed on
        :attr:`device`, where it is reduced."""
        return self.io.decode_chunk(self.compressor, frames, length).to(self.device)

    def envelope(self, typ: str, index: int, chunk: int, frame: bytes, weight: float = 0.0) -> Envelope:
        """The header of one data message (one frame) of partition ``index``, chunk ``chunk``."""
        env = self.io.envelope(typ, digest=self.layout.digest, numel=self.layout.numel)
        return replace(env, index=index, chunk=chunk, weight=weight, frames=1, nbytes=len(frame))

    def encode_part(self, part: torch.Tensor, i: int, c: int) -> bytes:
        """This peer's encoded contribution to chunk ``c`` of partition ``i``.

        Error-feedback memory is keyed by what is sent, never by a chunk's position: the key is the
        flat vector's identity (the round kind and :attr:`Layout.spec`, the tensors' names and
        shapes), so two tensor sets (Streaming DiLoCo's fragments) never share memory. A codec with
        ``compress_span`` (``compression.feedback``) keeps one flat memory per vector and reads and
        writes only this chunk's elements: a new group size (another cut into partitions) finds each
        element's residual where it left it. Any other codec gets ``key/a:b``, the chunk's range.
        """
        a, b = self.layout.chunks[i][c]
        key = f"{self.io.kind}/{self.layout.spec}"
        comp = self.compressor
        if isinstance(comp, SpanCompressor):
            return encode_packet_bytes(comp.compress_span(part, key=key, lo=a, total=self.layout.numel))
        return encode_packet_bytes(comp.compress(part, key=f"{key}/{a}:{b}"))

    def encode_parts(self, flat: torch.Tensor, order: list[tuple[int, int]]) -> Iterator[bytes]:
        """This peer's encoded contributions to the chunks ``order`` (``(partition, chunk)`` pairs), in
        that order.

        A codec without span memory goes through ``compression.staging.compress_many``: on a GPU the
        device encode of one chunk overlaps the copy of the previous one into a reused pinned host
        buffer, and the frame is joined once from that buffer (the one host copy left: frames stay
        ``bytes`` because the owner check keeps them and the mailbox's peers compare them). On the
        host it is plain ``compress``. Span (error-feedback) codecs encode chunk by chunk.
        """
        if isinstance(self.compressor, SpanCompressor):
            for i, c in order:
                a, b = self.layout.chunks[i][c]
                yield self.encode_part(flat[a:b], i, c)
            return
        key = f"{self.io.kind}/{self.layout.spec}"
        items = []
        for i, c in order:
            a, b = self.layout.chunks[i][c]
            items.append((flat[a:b], f"{key}/{a}:{b}"))
        for staged in compress_many(self.compressor, items):
            try:
                yield b"".join(staged.wire_parts())
            finally:
                staged.release()

    def encode_aggregate(self, agg: torch.Tensor, i: int, c: int) -> bytes:
        """The encoded aggregate of chunk ``c`` of partition ``i`` (a primary and its verifier use the
        same key, so honest ones encode the same bytes).

        An owner's error-feedback memory of its aggregates is keyed by the vector and its partition's
        range (``kind/agg/spec/lo:hi``), a flat memory of the partition's size; when the partition
        changes (a new group), the memory of this vector's other partitions is dropped (``retain``):
        the elements they held belong to other owners now, who never saw that rounding error.
        """
        a, b = self.layout.chunks[i][c]
        lo, hi = self.layout.chunks[i][0][0], self.layout.chunks[i][-1][1]
        prefix = f"{self.io.kind}/agg/{self.layout.spec}/"
        key = f"{prefix}{lo}:{hi}"
        codec = self.agg_codec
        if not isinstance(codec, SpanCompressor):
            return encode_packet_bytes(codec.compress(agg, key=f"{prefix}{a}:{b}"))
        if isinstance(codec, RetainingCompressor):
            codec.retain(prefix, key)
        return encode_packet_bytes(codec.compress_span(agg, key=key, lo=a - lo, total=hi - lo))
