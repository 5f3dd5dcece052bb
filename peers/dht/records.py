"""Peer records: what each peer announces about itself in the DHT (ID, run, role, progress, version).

A record lives under the DHT key ``"<run_id>.peers"`` with the peer ID as subkey and a short
expiration; the node's heartbeat re-stores it before it expires (a TTL heartbeat), so a peer that
dies disappears after at most one TTL. A peer that leaves on purpose overwrites its record with a
tombstone (``left=True``) so it disappears at once. Records come from other peers: they are decoded
with the core's bounded msgpack and validated field by field; a bad record is skipped, never trusted.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack

from swarmtrain.core.config import RUN_ID_PATTERN
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.safe_msgpack import unpack

#: a run ID: 1-64 letters, digits, '_', '.', '-' (it names DHT keys and stream handlers)

__all__ = ["PeerRecord", "encode_record", "decode_record", "peers_key", "MAX_RECORD_BYTES", "RUN_ID_PATTERN"]

MAX_RECORD_BYTES = 8192
_MAX_EXTRA = 16


def peers_key(run_id: str) -> str:
    """DHT key under which the peers of ``run_id`` publish their records."""
    return f"{run_id}.peers"


@dataclass(frozen=True)
class PeerRecord:
    """One peer's public status.

    Attributes:
        peer_id: libp2p peer ID (base58).
        run_id: the run this peer trains.
        role: ``"trainer"``, ``"bootstrap"``, ``"monitor"``, ``"stage:<i>"``...
        step: local optimizer steps done.
        round: collective round number reached.
        throughput: measured samples (or tokens) per second, as the trainer reports it.
        loss: the latest training loss (NaN if unknown).
        version: swarmtrain version of the peer.
        region: a free-text region label (``"eu-west"``...).
        maddrs: the multiaddrs others can dial.
        bytes_sent: the peer's ledger total of bytes sent.
        bytes_received: the peer's ledger total of bytes received.
        contributed_tokens: tokens of this peer's own training steps that went into rounds it
            committed (its contribution since it started; as the peer claims it, unverified).
        committed_rounds: rounds this peer committed since it started (as it claims).
        time: DHT time of this update.
        left: tombstone: the peer deregistered.
        extra: small extra fields (str -> float/int/str).
    """

    peer_id: str
    run_id: str
    role: str = "trainer"
    step: int = 0
    round: int = 0
    throughput: float = 0.0
    loss: float = float("nan")
    version: str = ""
    region: str = "unknown"
    maddrs: tuple[str, ...] = ()
    bytes_sent: int = 0
    bytes_received: int = 0
    contributed_tokens: int = 0
    committed_rounds: int = 0
    time: float = 0.0
    left: bool = False
    extra: dict[str, float | int | str] = field(default_factory=dict)


_INT = ("step", "round", "bytes_sent", "bytes_received", "contributed_tokens", "committed_rounds")
_FLOAT = ("throughput", "loss", "time")
_STR = ("peer_id", "run_id", "role", "version", "region")


def encode_record(rec: PeerRecord) -> bytes:
    """Serialise a record for the DHT (msgpack)."""
    d = asdict(rec)
    d["maddrs"] = list(rec.maddrs)
    body = bytes(msgpack.packb(d, use_bin_type=True))
    if len(body) > MAX_RECORD_BYTES:
        raise ProtocolError("peer record too large")
    return body


def decode_record(data: Any) -> PeerRecord:
    """Parse and validate a record read from the DHT.

    Raises:
        ProtocolError: anything malformed, ill-typed or oversized.
    """
    if not isinstance(data, bytes) or len(data) > MAX_RECORD_BYTES:
        raise ProtocolError("peer record is not bytes or too large")
    obj = unpack(data, what="peer record", max_bytes=MAX_RECORD_BYTES, max_str=1024, max_array=32, max_map=64)
    if not isinstance(obj, dict):
        raise ProtocolError("peer record is not a map")
    known = {f for f in PeerRecord.__dataclass_fields__}
    obj = {k: v for k, v in obj.items() if k in known}  # newer peers may add fields: ignore them
    for k in _STR:
        if k in obj and (not isinstance(obj[k], str) or len(obj[k]) > 128):
            raise ProtocolError(f"peer record field {k} invalid")
    for k in _INT:
        if k in obj and (
            not isinstance(obj[k], int) or isinstance(obj[k], bool) or not 0 <= obj[k] < 1 << 62
        ):
            raise ProtocolError(f"peer record field {k} invalid")
    for k in _FLOAT:
        if k in obj:
            if not isinstance(obj[k], int | float) or isinstance(obj[k], bool):
                raise ProtocolError(f"peer record field {k} invalid")
            obj[k] = float(obj[k])
    if "throughput" in obj and (not math.isfinite(obj["throughput"]) or obj["throughput"] < 0):
        raise ProtocolError("peer record throughput invalid")
    if "left" in obj and not isinstance(obj["left"], bool):
        raise ProtocolError("peer record field left invalid")
    maddrs = obj.get("maddrs", [])
    if not isinstance(maddrs, list) or not all(isinstance(m, str) and len(m) < 512 for m in maddrs):
        raise ProtocolError("peer record maddrs invalid")
    obj["maddrs"] = tuple(maddrs)
    extra = obj.get("extra", {})
    if not isinstance(extra, dict) or len(extra) > _MAX_EXTRA:
        raise ProtocolError("peer record extra invalid")
    for k, v in extra.items():
        if not isinstance(k, str) or not isinstance(v, int | float | str) or isinstance(v, bool):
            raise ProtocolError("peer record extra invalid")
        if isinstance(v, str) and len(v) > 128:
            raise ProtocolError("peer record extra invalid")
    if "peer_id" not in obj or "run_id" not in obj:
        raise ProtocolError("peer record lacks peer_id or run_id")
    return PeerRecord(**obj)
