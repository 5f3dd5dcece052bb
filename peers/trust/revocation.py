"""Token revocation: a record signed by the run key that withdraws a peer's admission before its
token expires.

``swarmtrain token revoke PEER_ID`` signs ``[run_id, peer_id, until]`` with the run key and stores it
in the DHT under ``"<run>.revoked"`` (subkey: the writer's peer ID; any admitted writer may carry it,
since only the run key's signature counts). Every peer reads that key at most every
:data:`REVOCATION_READ_S` seconds (``peers.trust.admitted.AdmittedPeers``) and refuses the revoked
peer's streams and leaves it out of its rounds. ``until`` is when the revocation may be forgotten:
the revoked token's expiry, or later.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgpack

from peers.trust.admission import MAX_TOKEN_BYTES, NotAdmitted, RunKey, _public_key
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.safe_msgpack import unpack

__all__ = ["Revocation", "sign_revocation", "decode_revocation", "revocations_key", "REVOCATION_READ_S"]

_DOMAIN = b"swarmtrain-revocation-v1\0"
#: seconds between two reads of the run's revocations by a running peer (honoured within a minute)
REVOCATION_READ_S = 20.0
#: revocations one writer's DHT record holds (each about 150 bytes)
MAX_PER_RECORD = 40


@dataclass(frozen=True)
class Revocation:
    """A checked revocation: ``peer_id`` is no longer admitted to ``run_id`` (until ``until``)."""

    run_id: str
    peer_id: str
    until: float


def revocations_key(run_id: str) -> str:
    """The DHT key under which revocations of ``run_id`` are stored."""
    return f"{run_id}.revoked"


def sign_revocation(key: RunKey, run_id: str, peer_id: str, until: float) -> bytes:
    """A revocation of ``peer_id``'s admission to ``run_id``, signed by the run key."""
    if not peer_id or len(peer_id) > 128 or not run_id:
        raise ConfigError("a revocation needs a run ID and a peer ID (at most 128 characters)")
    body = bytes(msgpack.packb([run_id, peer_id, float(until)], use_bin_type=True))
    return bytes(msgpack.packb([body, key.sign(_DOMAIN + body)], use_bin_type=True))


def decode_revocation(blob: bytes, run_public: bytes) -> Revocation:
    """Check a revocation's signature against the run's public key.

    Raises:
        NotAdmitted: malformed, oversized, or not signed by the run key (a ``ProtocolError``).
    """
    from cryptography.exceptions import InvalidSignature

    if not isinstance(blob, bytes) or len(blob) > MAX_TOKEN_BYTES:
        raise NotAdmitted("revocation malformed or too large")
    try:
        outer = unpack(
            blob, what="revocation", max_bytes=MAX_TOKEN_BYTES, max_bin=MAX_TOKEN_BYTES, max_array=2
        )
        if not (isinstance(outer, list) and len(outer) == 2 and all(isinstance(x, bytes) for x in outer)):
            raise ProtocolError("revocation is not [body, signature]")
        inner = unpack(outer[0], what="revocation body", max_bytes=MAX_TOKEN_BYTES, max_array=3, max_map=0)
    except ProtocolError as e:
        raise NotAdmitted(str(e)) from None
    if not (
        isinstance(inner, list)
        and len(inner) == 3
        and isinstance(inner[0], str)
        and isinstance(inner[1], str)
        and isinstance(inner[2], float)
    ):
        raise NotAdmitted("revocation body is not [run, peer, until]")
    try:
        _public_key(run_public).verify(outer[1], _DOMAIN + outer[0])
    except InvalidSignature:
        raise NotAdmitted("revocation not signed by this run's key") from None
    return Revocation(inner[0], inner[1], inner[2])
