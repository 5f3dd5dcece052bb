"""Typed, bounded message framing for swarmtrain's own libp2p stream protocols (msgpack, never pickle).

Every stream carries one *message*: a header frame (a msgpack map validated into an :class:`Envelope`)
followed by ``Envelope.frames`` data frames, each a 4-byte big-endian length and that many bytes. The
receiver answers with one small ack frame. Bulk data thus travels in parts of at most
:data:`MAX_FRAME` bytes over streams (hivemind's unary RPC is capped at 4 MiB and is much slower).

Everything here parses bytes that came from another peer, so every field is type- and range-checked
and every failure raises :class:`swarmtrain.core.errors.ProtocolError`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeAlias

import msgpack

import compression  # noqa: F401  (registers the built-in codecs the wire's allow-list derives from)
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.packet import Packet
from swarmtrain.core.safe_msgpack import unpack
from swarmtrain.core.wire import decode_packet, encode_packet

__all__ = [
    "Envelope",
    "MESSAGE_TYPES",
    "MAX_HEADER",
    "MAX_FRAME",
    "MAX_FRAMES",
    "FRAME_PREFIX",
    "encode_frame_length",
    "decode_frame_length",
    "encode_envelope",
    "decode_envelope",
    "encode_ack",
    "decode_ack",
    "encode_packet_bytes",
    "decode_packet_bytes",
    "FrameParts",
    "Frame",
    "frame_parts",
]

MESSAGE_TYPES = frozenset(
    {"part", "agg", "gather", "abort", "have", "grp", "join", "state_req", "state_hdr", "vpart", "vdig"}
    | {"sw_fwd", "sw_bwd", "sw_out"}  # SWARM stage requests and replies (peers.swarm.protocol)
)
MAX_HEADER = 64 * 1024  # bytes of one msgpack header frame
MAX_FRAME = 16 * 1024 * 1024  # bytes of one data frame (the sender uses <= 4-8 MiB parts)
MAX_FRAMES = 1 << 16  # data frames of one message
FRAME_PREFIX = 4  # bytes of the big-endian length in front of every frame
_MAX_STR = 256
_MAX_DIGEST = 64


def encode_frame_length(n: int) -> bytes:
    """The 4-byte length prefix of a frame of ``n`` bytes."""
    if not 0 <= n <= MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
    return struct.pack(">I", n)


def decode_frame_length(prefix: bytes, limit: int = MAX_FRAME) -> int:
    """Parse a 4-byte length prefix and check it against ``limit``."""
    if len(prefix) != FRAME_PREFIX:
        raise ProtocolError("truncated frame prefix")
    (n,) = struct.unpack(">I", prefix)
    if n > limit:
        raise ProtocolError(f"peer announced a {n}-byte frame; limit is {limit}")
    return int(n)


@dataclass(frozen=True)
class Envelope:
    """Header of one stream message.

    Attributes:
        type: one of :data:`MESSAGE_TYPES`.
        run: run ID; messages of another run are refused.
        kind: ledger kind of the traffic (``"reduce"``, ``"gather"``, ``"state"``, ...).
        round: collective round number (``-1`` for state transfer).
        digest: group digest of the round (16 bytes) or a state hash (32 bytes).
        index: partition index for ``part``/``agg``; ``-1`` otherwise.
        weight: the sender's reducer weight (``part`` only), finite and >= 0.
        frames: number of data frames that follow.
        nbytes: total bytes of those data frames.
        numel: total elements of the flat vector being reduced (``part``/``agg``), else 0.
        chunk: chunk index within the partition (``part``/``agg``), else 0.
        note: a short free-text reason (``abort``) or JSON metadata (``state_hdr``), bounded.
    """

    type: str
    run: str
    kind: str
    round: int
    digest: bytes = b""
    index: int = -1
    weight: float = 0.0
    frames: int = 0
    nbytes: int = 0
    numel: int = 0
    chunk: int = 0
    note: str = ""


_FIELDS: dict[str, tuple[type, ...]] = {
    "type": (str,),
    "run": (str,),
    "kind": (str,),
    "round": (int,),
    "digest": (bytes,),
    "index": (int,),
    "weight": (float, int),
    "frames": (int,),
    "nbytes": (int,),
    "numel": (int,),
    "chunk": (int,),
    "note": (str,),
}


def encode_envelope(env: Envelope) -> bytes:
    """Serialise a header (msgpack map); refuses a header over :data:`MAX_HEADER`."""
    body = msgpack.packb(asdict(env), use_bin_type=True)
    if len(body) > MAX_HEADER:
        raise ProtocolError("message header too large")
    return bytes(body)


def _unpack(data: bytes, limit: int, what: str) -> Any:
    # Headers and acks are small flat maps; strings and byte strings are bounded only by ``limit``.
    return unpack(
        data,
        what=what,
        max_bytes=limit,
        max_str=limit,
        max_bin=limit,
        max_array=1024,
        max_map=64,
    )


def decode_envelope(data: bytes, max_note: int = 4096) -> Envelope:
    """Parse and validate a header frame from a peer.

    Raises:
        ProtocolError: not a map, unknown/missing/ill-typed field, or a value out of range.
    """
    obj = _unpack(data, MAX_HEADER, "message header")
    if not isinstance(obj, dict):
        raise ProtocolError("message header is not a map")
    unknown = set(obj) - set(_FIELDS)
    if unknown:
        raise ProtocolError(f"unknown header fields {sorted(map(str, unknown))[:4]}")
    for name, types in _FIELDS.items():
        if name in obj and (not isinstance(obj[name], types) or isinstance(obj[name], bool)):
            raise ProtocolError(f"header field {name!r} has type {type(obj[name]).__name__}")
    for name in ("type", "run", "kind", "round"):
        if name not in obj:
            raise ProtocolError(f"header field {name!r} missing")
    env = Envelope(**{**obj, "weight": float(obj.get("weight", 0.0))})
    if env.type not in MESSAGE_TYPES:
        raise ProtocolError(f"unknown message type {env.type[:32]!r}")
    if len(env.run) > _MAX_STR or len(env.kind) > 64:
        raise ProtocolError("run or kind string too long")
    if not -1 <= env.round < 1 << 62 or not -1 <= env.index < 1 << 20:
        raise ProtocolError("round or index out of range")
    if len(env.digest) > _MAX_DIGEST:
        raise ProtocolError("digest too long")
    if not math.isfinite(env.weight) or env.weight < 0:
        raise ProtocolError("weight must be finite and >= 0")
    if not 0 <= env.frames <= MAX_FRAMES or not 0 <= env.nbytes <= MAX_FRAME * MAX_FRAMES:
        raise ProtocolError("frame count or byte count out of range")
    if not 0 <= env.numel < 1 << 40 or not 0 <= env.chunk < 1 << 30:
        raise ProtocolError("numel or chunk out of range")
    if len(env.note) > max_note:
        raise ProtocolError("note too long")
    return env


def encode_ack(ok: bool, error: str = "") -> bytes:
    """The receiver's one-frame answer to a message."""
    return bytes(msgpack.packb({"ok": bool(ok), "err": error[:200]}, use_bin_type=True))


def decode_ack(data: bytes) -> tuple[bool, str]:
    """Parse an ack frame: ``(ok, error)``."""
    obj = _unpack(data, 1024, "ack")
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("ok"), bool)
        or not isinstance(obj.get("err", ""), str)
    ):
        raise ProtocolError("malformed ack")
    return bool(obj["ok"]), str(obj.get("err", ""))


# --- packets on the wire -----------------------------------------------------------------------------


def encode_packet_bytes(p: Packet) -> bytes:
    """Serialise a codec packet (:func:`swarmtrain.core.wire.encode_packet`)."""
    return encode_packet(p)


def decode_packet_bytes(data: bytes, *, max_bytes: int = MAX_FRAME) -> Packet:
    """Parse a packet from a peer, at most ``max_bytes`` long (:func:`swarmtrain.core.wire.decode_packet`).

    Raises:
        ProtocolError: oversized or malformed bytes.
    """
    return decode_packet(data, max_bytes=max_bytes)


@dataclass(frozen=True)
class FrameParts:
    """One data frame given as segments (a packet's msgpack head and memoryviews of its payload in
    pinned host memory, ``compression.staging``): the transport writes them one after the other
    under one length prefix, so the payload is never joined into a new ``bytes``.

    The receiver sees one ordinary frame. ``len()`` is the frame's length.
    """

    parts: tuple[bytes | memoryview, ...]

    def __len__(self) -> int:
        return sum(memoryview(p).nbytes for p in self.parts)

    def __iter__(self) -> Iterator[bytes | memoryview]:
        return iter(self.parts)

    def tobytes(self) -> bytes:
        """The frame joined (a copy: for a verifier that keeps the bytes, and for tests)."""
        return b"".join(self.parts)


#: what a channel sends as one data frame
Frame: TypeAlias = bytes | memoryview | FrameParts


def frame_parts(parts: Sequence[bytes | memoryview]) -> FrameParts:
    """A :class:`FrameParts` of ``parts`` (e.g. ``StagedPacket.wire_parts()``)."""
    return FrameParts(tuple(parts))
