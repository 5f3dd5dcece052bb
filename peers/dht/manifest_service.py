"""Serving and fetching the run manifest (``peers.trust.manifest``) over libp2p.

Every peer that holds the run's manifest answers stream handler :data:`HANDLER`: it writes the signed
document as one length-prefixed frame and closes; it reads nothing from the caller. The manifest is
public (it holds the run's settings, public key and allowlist, nothing secret), so anyone may ask;
at most :data:`MAX_STREAMS` are served at a time.

A volunteer fetches it with :func:`peers.dht.manifest_fetch.fetch_manifest`.
"""

from __future__ import annotations

import logging
from typing import Any

from peers.trust.manifest import RunManifest, parse_manifest
from peers.wire.transport import write_frame_drained

__all__ = ["HANDLER", "MAX_STREAMS", "ManifestServer"]

logger = logging.getLogger(__name__)
HANDLER = "swarmtrain.manifest"
MAX_STREAMS = 8


class ManifestServer:
    """Serves ``document`` (a signed manifest, checked here first) on ``p2p`` (a hivemind ``P2P``),
    whose coroutines run on ``loop`` (a :class:`peers.wire.transport.LoopThread`)."""

    def __init__(self, p2p: Any, loop: Any, document: bytes) -> None:
        self.manifest: RunManifest = parse_manifest(document)
        self.document = document
        self.p2p = p2p
        self.loop = loop
        self.active = 0
        self.served = 0
        loop.run(p2p.add_binary_stream_handler(HANDLER, self._handle), 15.0)

    async def _handle(self, info: Any, reader: Any, writer: Any) -> None:
        if self.active >= MAX_STREAMS:
            writer.close()
            return
        self.active += 1
        try:
            await write_frame_drained(writer, self.document)
            self.served += 1
        except (ConnectionError, OSError) as e:
            logger.info("manifest stream ended: %s", e)
        finally:
            self.active -= 1
            writer.close()

    def close(self) -> None:
        """Stop serving."""
        try:
            self.loop.run(self.p2p.remove_binary_stream_handler(HANDLER), 5.0)
        except Exception:
            logger.debug("removing the manifest handler failed", exc_info=True)
