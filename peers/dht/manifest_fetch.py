"""Fetching the run manifest from an initial peer (the client side of ``peers.dht.manifest_service``).

A volunteer that knows only an address ``/ip4/.../p2p/<peer id>`` calls :func:`fetch_manifest`: a
throwaway libp2p identity dials that peer (libp2p authenticates its peer ID) and reads one frame of
at most :data:`peers.trust.manifest.MAX_MANIFEST_BYTES`, which
:func:`peers.trust.manifest.parse_manifest` checks.
"""

from __future__ import annotations

import logging
from typing import Any

from peers.dht.manifest_service import HANDLER
from peers.trust.manifest import MAX_MANIFEST_BYTES, RunManifest, parse_manifest
from peers.wire.transport import read_frame
from swarmtrain.core.errors import ConfigError, PeerTimeoutError, ProtocolError, SwarmError

__all__ = ["fetch_manifest", "peer_of_maddr"]

logger = logging.getLogger(__name__)
_READ_S = 20.0


def peer_of_maddr(maddr: str) -> str:
    """The peer ID a multiaddr ends with (``.../p2p/<id>``).

    Raises:
        ConfigError: the address names no peer.
    """
    parts = maddr.rstrip("/").split("/")
    if len(parts) < 3 or parts[-2] not in ("p2p", "ipfs") or not parts[-1].isalnum():
        raise ConfigError(f"initial peer {maddr!r} does not end with /p2p/<peer id>")
    return parts[-1]


async def _fetch_one(p2p: Any, peer_id: str) -> bytes:
    from hivemind.p2p import PeerID

    try:
        _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), HANDLER)
    except Exception as e:  # p2pd reports an unreachable peer or a missing handler with several types
        raise SwarmError(f"{type(e).__name__}: {e}") from None
    try:
        return await read_frame(reader, MAX_MANIFEST_BYTES, _READ_S)
    finally:
        writer.close()


def fetch_manifest(initial_peers: list[str], timeout: float = 60.0) -> tuple[RunManifest, bytes, str]:
    """The run manifest served by the first of ``initial_peers`` that has a valid one.

    Returns:
        the checked manifest, its document (to serve it on) and the peer ID it came from.

    Raises:
        ConfigError: no address given, or an address without a peer ID.
        SwarmError: no initial peer served a valid manifest (the message says what each did).
    """
    from hivemind.p2p import P2P

    from peers.dht.node import validate_maddrs
    from peers.keys.identity import throwaway_identity
    from peers.wire.transport import LoopThread

    initial = validate_maddrs(list(initial_peers), "initial_peers")
    if not initial:
        raise ConfigError("give --initial-peers: the address of any peer of the run")
    targets = [peer_of_maddr(m) for m in initial]
    loop = LoopThread("swarmtrain-manifest")
    p2p: Any = None
    problems: list[str] = []
    try:

        async def start() -> Any:
            return await P2P.create(
                initial_peers=initial,
                host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                identity_path=throwaway_identity(),
                check_if_identity_free=False,
            )

        try:
            p2p = loop.run(start(), timeout)
        except PeerTimeoutError:
            raise SwarmError(f"no initial peer answered within {timeout:.0f} s") from None
        except Exception as e:
            raise SwarmError(f"could not reach the initial peers: {type(e).__name__}: {e}") from None
        for peer in dict.fromkeys(targets):
            try:
                document = loop.run(_fetch_one(p2p, peer), timeout)
                return parse_manifest(document), document, peer
            except (SwarmError, ProtocolError) as e:
                problems.append(f"{peer[:12]}: {e}")
        raise SwarmError("no initial peer served a valid run manifest (" + "; ".join(problems) + ")")
    finally:
        if p2p is not None:
            try:
                loop.run(p2p.shutdown(), 5.0)
            except Exception:
                logger.debug("manifest client shutdown failed", exc_info=True)
        loop.stop()
