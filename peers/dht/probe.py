"""Link probes: every live peer answers a tiny echo/download protocol so ``swarmtrain doctor`` can
measure round-trip time and bandwidth to it.

One stream (handler ``swarmtrain.<run_id>.probe``) carries up to :data:`MAX_REQUESTS` requests, each
one length-prefixed frame of at most :data:`MAX_REQUEST` bytes (untrusted input: bounded, no pickle,
no msgpack):

* ``b"E" + payload`` (payload at most :data:`MAX_ECHO` bytes): the server sends the frame back.
* ``b"D" + 4-byte big-endian N`` (``0 < N <= MAX_DOWNLOAD``): the server sends one frame of N zero
  bytes. A stream downloads at most :data:`MAX_STREAM_BYTES` in all.

Only peers admitted to the run are answered (``peers.trust.admission``), at most :data:`MAX_STREAMS` streams
at a time; anything else closes the stream. Bytes are counted in the node's ledger as kind ``probe``.
"""

from __future__ import annotations

import logging
import statistics
import struct
import time
from dataclasses import dataclass
from typing import Any

from peers.wire.budgets import RequesterBudget
from peers.wire.ledger import STATE_ROUND
from peers.wire.messages import FRAME_PREFIX
from peers.wire.transport import read_frame, read_header, write_frame, write_frame_drained
from swarmtrain.core.errors import PeerTimeoutError, ProtocolError, SwarmError

__all__ = [
    "ProbeServer",
    "ProbeResult",
    "serve_probes",
    "probe_peer",
    "parse_request",
    "encode_echo",
    "encode_download",
    "probe_handler_name",
    "MAX_REQUEST",
    "MAX_ECHO",
    "MAX_DOWNLOAD",
    "MAX_STREAM_BYTES",
    "MAX_REQUESTS",
    "MAX_STREAMS",
]

logger = logging.getLogger(__name__)
KIND = "probe"
MAX_ECHO = 64  # bytes of one echo payload
MAX_REQUEST = 1 + MAX_ECHO  # bytes of one request frame
MAX_DOWNLOAD = 4 << 20  # bytes one download request may ask for
MAX_STREAM_BYTES = 8 << 20  # bytes one stream may download in all
MAX_REQUESTS = 32  # requests per stream
MAX_STREAMS = 4  # probe streams served at once
_IDLE_S = 10.0  # seconds a probe stream may wait for its next request
_ZEROS = memoryview(bytes(MAX_DOWNLOAD))  # what downloads send (read-only, shared)
#: download bytes one requester may take per minute (a doctor probe takes 1 MiB), and all together
PROBE_BYTES_PER_MINUTE = 16 << 20
PROBE_TOTAL_PER_MINUTE = 64 << 20


def probe_handler_name(run_id: str) -> str:
    """The stream handler name of ``run_id``'s probes."""
    return f"swarmtrain.{run_id}.probe"


def encode_echo(payload: bytes) -> bytes:
    """An echo request carrying ``payload`` (at most :data:`MAX_ECHO` bytes)."""
    if len(payload) > MAX_ECHO:
        raise ValueError(f"echo payload over {MAX_ECHO} bytes")
    return b"E" + payload


def encode_download(nbytes: int) -> bytes:
    """A request for ``nbytes`` bytes (``0 < nbytes <= MAX_DOWNLOAD``)."""
    if not 0 < nbytes <= MAX_DOWNLOAD:
        raise ValueError(f"download size must be in (0, {MAX_DOWNLOAD}]")
    return b"D" + struct.pack(">I", nbytes)


def parse_request(body: bytes) -> tuple[str, int]:
    """Check a request frame from a peer: ``("echo", payload length)`` or ``("download", N)``.

    Raises:
        ProtocolError: empty, oversized, unknown type, or a download size out of range.
    """
    if not body or len(body) > MAX_REQUEST:
        raise ProtocolError("probe request is empty or too large")
    kind = body[:1]
    if kind == b"E":
        return "echo", len(body) - 1
    if kind == b"D":
        if len(body) != 5:
            raise ProtocolError("probe download request is not 5 bytes")
        (n,) = struct.unpack(">I", body[1:])
        if not 0 < n <= MAX_DOWNLOAD:
            raise ProtocolError(f"probe download of {n} bytes is out of range")
        return "download", n
    raise ProtocolError("unknown probe request type")


class ProbeServer:
    """Answers probes of admitted peers on ``node`` (a started :class:`peers.dht.node.PeerNode`)."""

    def __init__(self, node: Any) -> None:
        self.node = node
        self.name = probe_handler_name(node.run_id)
        self.active = 0
        self.served = 0
        #: per-requester and total download bytes per minute
        self.budget = RequesterBudget(PROBE_BYTES_PER_MINUTE, PROBE_TOTAL_PER_MINUTE)
        node.loop.run(node.p2p.add_binary_stream_handler(self.name, self._handle), 15.0)

    async def _handle(self, info: Any, reader: Any, writer: Any) -> None:
        sender = str(info.peer_id.to_base58())
        sent = received = 0
        if self.active >= MAX_STREAMS:
            writer.close()
            return
        self.active += 1
        try:
            if not await self.node.admitted.acheck(sender):
                raise ProtocolError("not admitted to the run")
            downloaded = 0
            for _ in range(MAX_REQUESTS):
                got = await read_header(reader, _IDLE_S)
                if got is None:  # the client is done
                    break
                body, n, _clock = got
                received += n
                kind, size = parse_request(body)
                if kind == "echo":
                    sent += write_frame(writer, body)
                    await writer.drain()
                    continue
                if downloaded + size > MAX_STREAM_BYTES:
                    raise ProtocolError("probe stream asked for too many bytes")
                if not self.budget.take(sender, size):
                    raise ProtocolError("the requester's probe bytes for this minute are spent")
                downloaded += size
                sent += await write_frame_drained(writer, _ZEROS[:size])
            self.served += 1
        except (SwarmError, ConnectionError, OSError) as e:
            logger.info("probe from %s ended: %s", sender[:16], e)
        finally:
            self.active -= 1
            self.node.ledger.add_sent(KIND, STATE_ROUND, sent)
            self.node.ledger.add_received(KIND, STATE_ROUND, received)
            writer.close()

    def close(self) -> None:
        """Stop answering probes."""
        try:
            self.node.loop.run(self.node.p2p.remove_binary_stream_handler(self.name), 5.0)
        except Exception:
            logger.debug("removing the probe handler failed", exc_info=True)


def serve_probes(node: Any) -> ProbeServer:
    """Register the probe handler on ``node`` (every training peer does, so doctors can measure it)."""
    return ProbeServer(node)


@dataclass(frozen=True)
class ProbeResult:
    """What one probe of a peer measured.

    Attributes:
        peer_id: the peer probed.
        rtt_s: median round-trip time of the echoes (seconds).
        rtts_s: every echo's round-trip time.
        bandwidth_bps: download bytes per second (payload only, request to last byte).
        downloaded: payload bytes downloaded.
    """

    peer_id: str
    rtt_s: float
    rtts_s: tuple[float, ...]
    bandwidth_bps: float
    downloaded: int


async def _probe(node: Any, peer: Any, run_id: str, pings: int, nbytes: int) -> ProbeResult:
    try:
        _, reader, writer = await node.p2p.call_binary_stream_handler(peer, probe_handler_name(run_id))
    except Exception as e:  # p2pd reports a dead or unknown peer with several error types
        raise SwarmError(f"cannot open a probe stream: {type(e).__name__}: {e}") from None
    sent = received = 0
    try:
        rtts = []
        for i in range(pings):
            payload = struct.pack(">Q", i)
            t0 = time.perf_counter()
            sent += write_frame(writer, encode_echo(payload))
            await writer.drain()
            back = await read_frame(reader, MAX_REQUEST, _IDLE_S)
            rtts.append(time.perf_counter() - t0)
            received += FRAME_PREFIX + len(back)
            if back != encode_echo(payload):
                raise ProtocolError("the peer echoed something else")
        t0 = time.perf_counter()
        sent += write_frame(writer, encode_download(nbytes))
        await writer.drain()
        data = await read_frame(reader, nbytes, _IDLE_S)
        wall = time.perf_counter() - t0
        received += FRAME_PREFIX + len(data)
        if len(data) != nbytes:
            raise ProtocolError("the peer sent a short download")
        return ProbeResult(
            peer_id=str(peer.to_base58()),
            rtt_s=float(statistics.median(rtts)) if rtts else float("nan"),
            rtts_s=tuple(rtts),
            bandwidth_bps=nbytes / max(wall, 1e-9),
            downloaded=nbytes,
        )
    except (ConnectionError, OSError) as e:
        raise SwarmError(f"probe stream broke: {e}") from None
    finally:
        node.ledger.add_sent(KIND, STATE_ROUND, sent)
        node.ledger.add_received(KIND, STATE_ROUND, received)
        writer.close()


def probe_peer(
    node: Any,
    peer_id: str,
    *,
    pings: int = 5,
    download_bytes: int = 1 << 20,
    timeout: float = 30.0,
    run_id: str | None = None,
) -> ProbeResult:
    """Measure RTT (median of ``pings`` small echoes) and bandwidth (a download of
    ``download_bytes``, at most :data:`MAX_DOWNLOAD`) to ``peer_id`` from ``node``.

    Raises:
        PeerTimeoutError: the probe took over ``timeout`` seconds.
        ProtocolError: the peer answered garbage (or refused: the stream closed early).
        SwarmError: the peer could not be reached.
    """
    from hivemind.p2p import PeerID

    if not 1 <= pings <= MAX_REQUESTS - 1:
        raise ValueError(f"pings must be in [1, {MAX_REQUESTS - 1}]")
    encode_download(download_bytes)  # checks the range
    peer = PeerID.from_base58(peer_id)
    try:
        return node.loop.run(_probe(node, peer, run_id or node.run_id, pings, download_bytes), timeout)  # type: ignore[no-any-return]
    except PeerTimeoutError:
        raise PeerTimeoutError(f"probe of {peer_id[:16]} took over {timeout:.0f} s") from None
