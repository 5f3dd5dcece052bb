"""Revocation records in the DHT (``peers.trust.revocation``): read them, store them.

Under ``"<run>.revoked"`` each writer's subkey holds a list of revocation blobs; only the run key's
signature counts (``AdmittedPeers.read_revocations`` checks each), so the writer is any admitted peer.
"""

from __future__ import annotations

from typing import Any

from peers.trust.revocation import MAX_PER_RECORD, revocations_key

__all__ = ["read_revocations", "store_revocations"]


def read_revocations(dht: Any, run_id: str, timeout: float = 10.0) -> list[bytes]:
    """Every revocation blob stored for ``run_id`` (unchecked; at most ``MAX_PER_RECORD`` a writer)."""
    found = dht.get(revocations_key(run_id), latest=True, return_future=True).result(timeout)
    if found is None or not isinstance(found.value, dict):
        return []
    out: list[bytes] = []
    for item in found.value.values():
        blobs = getattr(item, "value", None)
        if isinstance(blobs, list):
            out.extend(b for b in blobs[:MAX_PER_RECORD] if isinstance(b, bytes))
    return out


def store_revocations(node: Any, blobs: list[bytes], until: float, timeout: float = 30.0) -> bool:
    """Store ``blobs`` (with those already stored under this node's subkey) until ``until`` (DHT time)."""
    from hivemind.utils import get_dht_time as dht_time

    old = []
    found = node.dht.get(revocations_key(node.run_id), latest=True, return_future=True).result(timeout)
    if found is not None and isinstance(found.value, dict) and node.peer_id in found.value:
        mine = found.value[node.peer_id].value
        old = [b for b in mine if isinstance(b, bytes) and b not in blobs] if isinstance(mine, list) else []
    value = (old + list(blobs))[-MAX_PER_RECORD:]
    fut = node.dht.store(
        revocations_key(node.run_id),
        value,
        max(until, dht_time() + 60.0),
        subkey=node.peer_id,
        return_future=True,
    )
    return bool(fut.result(timeout))
