"""Fetching the run manifest from an initial peer (the client side of ``peers.dht.manifest_service``).

A volunteer that knows only an address ``/ip4/.../p2p/<peer id>`` calls :func:`fetch_manifest`: a
throwaway libp2p identity dials that peer (libp2p authenticates its peer ID) and reads one frame of
at most :data:`peers.trust.manifest.MAX_MANIFEST_BYTES`, which
:func:`peers.trust.manifest.parse_manifest` checks.
"""

from __future__ import annotations

import logging
import re
import socket
from typing import Any

from peers.dht.manifest_service import HANDLER
from peers.trust.manifest import MAX_MANIFEST_BYTES, RunManifest, parse_manifest
from peers.wire.transport import read_frame
from swarmtrain.core.errors import ConfigError, PeerTimeoutError, ProtocolError, SwarmError

__all__ = ["fetch_manifest", "peer_of_maddr", "NoManifest", "reach_tcp", "dial_problem"]

logger = logging.getLogger(__name__)
_READ_S = 20.0
#: seconds a plain TCP connect to an initial peer's address may take before it counts as a timeout
TCP_TIMEOUT_S = 5.0
_GO_TIMESTAMP = re.compile(r"\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(\.\d+)? ")


class NoManifest(SwarmError):
    """The initial peers answered, but none served a valid run manifest (a run made without one)."""


def reach_tcp(maddr: str, timeout: float = TCP_TIMEOUT_S) -> str | None:
    """What a plain TCP connect to ``maddr``'s host and port says, as a refusal's words, or ``None``
    when it was accepted (or the address has no TCP part to try).

    ``"nothing listens at H:P (connection refused)"``, ``"H:P did not answer within N s (...)"``, or
    the OS's reason (no route, unreachable network).
    """
    parts = maddr.strip("/").split("/")
    if len(parts) < 4 or parts[0] not in ("ip4", "ip6", "dns", "dns4", "dns6") or parts[2] != "tcp":
        return None
    host, port = parts[1], int(parts[3]) if parts[3].isdigit() else -1
    if not 0 < port < 65536:
        return None
    where = f"[{host}]:{port}" if parts[0] == "ip6" else f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except ConnectionRefusedError:
        return f"nothing listens at {where} (connection refused): is the peer running, is the port right?"
    except TimeoutError:
        return (
            f"{where} did not answer within {timeout:.0f} s: a firewall or NAT drops the connection, "
            "or the host is down"
        )
    except OSError as e:
        return f"cannot connect to {where}: {e.strerror or e}"


def dial_problem(error: BaseException) -> str:
    """A daemon's or dial's error as one line: Go log timestamps dropped, whitespace folded."""
    text = _GO_TIMESTAMP.sub("", f"{error}")
    return " ".join(text.split())[:300] or type(error).__name__


def peer_of_maddr(maddr: str) -> str:
    """The peer ID a multiaddr ends with (``.../p2p/<id>``).

    Raises:
        ConfigError: the address names no peer.
    """
    parts = maddr.rstrip("/").split("/")
    if len(parts) < 3 or parts[-2] not in ("p2p", "ipfs") or not parts[-1].isalnum():
        raise ConfigError(f"initial peer {maddr!r} does not end with /p2p/<peer id>")
    return parts[-1]


def _address(maddr: str) -> str:
    """``/ip4/H/tcp/P/p2p/X`` -> ``H:P`` (the address part, for messages)."""
    parts = maddr.strip("/").split("/")
    return f"{parts[1]}:{parts[3]}" if len(parts) >= 4 else maddr


async def _fetch_one(p2p: Any, peer_id: str) -> bytes:
    from hivemind.p2p import PeerID

    try:
        _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(peer_id), HANDLER)
    except Exception as e:  # p2pd reports an unreachable peer or a missing handler with several types
        raise SwarmError(f"{type(e).__name__}: {dial_problem(e)}") from None
    try:
        return await read_frame(reader, MAX_MANIFEST_BYTES, _READ_S)
    finally:
        writer.close()


def _start_client(loop: Any, initial: list[str], timeout: float) -> Any:
    """A throwaway libp2p client connected to ``initial`` (addresses that accept TCP).

    Raises:
        SwarmError: a timeout, or the dial failed although the port accepts TCP (the peer ID).
    """
    from hivemind.p2p import P2P

    from peers.keys.identity import throwaway_identity

    async def start() -> Any:
        return await P2P.create(
            initial_peers=initial,
            host_maddrs=["/ip4/127.0.0.1/tcp/0"],
            identity_path=throwaway_identity(),
            check_if_identity_free=False,
        )

    try:
        return loop.run(start(), timeout)
    except PeerTimeoutError:
        raise SwarmError(f"no initial peer answered within {timeout:.0f} s") from None
    except Exception as e:  # the address accepts TCP, so the dial itself failed: the peer ID
        raise SwarmError(
            f"a peer listens at {_address(initial[0])} but peer ID {peer_of_maddr(initial[0])} does not "
            f"answer there (check the /p2p/ part of the address): {dial_problem(e)}"
        ) from None


def fetch_manifest(initial_peers: list[str], timeout: float = 60.0) -> tuple[RunManifest, bytes, str]:
    """The run manifest served by the first of ``initial_peers`` that has a valid one.

    Returns:
        the checked manifest, its document (to serve it on) and the peer ID it came from.

    Raises:
        ConfigError: no address given, or an address without a peer ID.
        SwarmError: no initial peer could be reached (nothing listening, a timeout, a peer ID that
            does not answer at its address: the message says which).
        NoManifest: the peers answered but none served a valid manifest (the message says what each did).
    """
    from peers.dht.node import validate_maddrs
    from peers.wire.transport import LoopThread

    initial = validate_maddrs(list(initial_peers), "initial_peers")
    if not initial:
        raise ConfigError("give --initial-peers: the address of any peer of the run")
    for m in initial:
        peer_of_maddr(m)
    dead = {m: why for m in initial if (why := reach_tcp(m, min(timeout, TCP_TIMEOUT_S))) is not None}
    if len(dead) == len(initial):
        raise SwarmError("; ".join(dict.fromkeys(dead.values())))
    initial = [m for m in initial if m not in dead]
    targets = [peer_of_maddr(m) for m in initial]
    loop = LoopThread("swarmtrain-manifest")
    p2p: Any = None
    problems: list[str] = []
    try:
        p2p = _start_client(loop, initial, timeout)
        for peer in dict.fromkeys(targets):
            try:
                document = loop.run(_fetch_one(p2p, peer), timeout)
                return parse_manifest(document), document, peer
            except (SwarmError, ProtocolError) as e:
                problems.append(f"{peer[:12]}: {e}")
        raise NoManifest("no initial peer served a valid run manifest (" + "; ".join(problems) + ")")
    finally:
        if p2p is not None:
            try:
                loop.run(p2p.shutdown(), 5.0)
            except Exception:
                logger.debug("manifest client shutdown failed", exc_info=True)
        loop.stop()
