"""Per-requester budgets on what a peer serves (issue 30.4, finding 5): one identity cannot take more
than its share of a donor's state uploads or of a peer's probe bytes per minute
(``peers.wire.budgets``, ``peers.state.state_chunks.ChunkServer``, ``peers.dht.probe.ProbeServer``).
The servers' stream handlers run on in-memory streams."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import torch

from peers.dht.probe import PROBE_BYTES_PER_MINUTE, ProbeServer, encode_download
from peers.state.state_chunks import MIN_CHUNK, STATES_PER_MINUTE, ChunkServer, Manifest, TokenBucket
from peers.state.state_transfer import serialize_state
from peers.wire.budgets import RequesterBudget
from peers.wire.ledger import ByteLedger
from peers.wire.messages import Envelope, decode_envelope, encode_envelope
from peers.wire.transport import FRAME_PREFIX, decode_frame_length, write_frame


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Writer:
    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: bytes | memoryview) -> None:
        self.out += bytes(data)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


class _Admitted:
    async def acheck(self, peer: str) -> bool:
        return True


class _Node:
    def __init__(self) -> None:
        self.admitted, self.loop, self.p2p, self.run_id, self.ledger = (
            _Admitted(),
            self,
            self,
            "r",
            ByteLedger(),
        )

    def run(self, coro: Any, timeout: float) -> None:
        coro.close()

    async def add_binary_stream_handler(self, name: str, handler: Any) -> None:
        return None


def _info(peer: str) -> Any:
    class PeerId:
        @staticmethod
        def to_base58() -> str:
            return peer

    class Info:
        peer_id = PeerId

    return Info()


def _handle(server: Any, peer: str, frames: list[bytes]) -> bytes:
    """What ``server`` sends back to ``peer`` for a stream carrying ``frames``."""
    req = _Writer()
    for f in frames:
        write_frame(req, f)  # type: ignore[arg-type]

    async def go() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(bytes(req.out))
        reader.feed_eof()
        w = _Writer()
        await server._handle(_info(peer), reader, w)
        return bytes(w.out)

    return asyncio.run(go())


def test_a_requester_gets_its_share_per_window_and_no_more() -> None:
    clock = Clock()
    b = RequesterBudget(100, total=250, window_s=60, max_requesters=3, clock=clock)
    assert b.take("A", 60) and not b.take("A", 41) and b.take("A", 40)  # A's 100 spent
    assert b.take("B", 100) and not b.take("C", 51)  # all together: 250 a window
    assert b.take("C", 50) and b.refused == 2
    clock.t = 60.0  # a new window
    assert b.take("A", 100) and b.used("A") == 100 and b.used("B") == 0
    for p in "DEFG":
        b.take(p, 1)
    assert len(b._used) == 3  # a crowd of identities costs bounded memory


def _state_request(digest: bytes, index: int) -> bytes:
    env = Envelope(type="state_req", run="r", kind="state", round=-1, digest=digest, index=index)
    return encode_envelope(env)


def _payload(reply: bytes) -> bytes:
    n = decode_frame_length(reply[:FRAME_PREFIX], 1 << 20)
    env = decode_envelope(reply[FRAME_PREFIX : FRAME_PREFIX + n])
    out, at = b"", FRAME_PREFIX + n
    for _ in range(env.frames):
        k = decode_frame_length(reply[at : at + FRAME_PREFIX], 1 << 30)
        out += reply[at + FRAME_PREFIX : at + FRAME_PREFIX + k]
        at += FRAME_PREFIX + k
    return out


def _pull(server: ChunkServer, peer: str, state_hash: bytes) -> bool:
    """``peer`` pulls the whole state (manifest, then every chunk); False once anything is refused."""
    reply = _handle(server, peer, [_state_request(state_hash, -1)])
    if not reply:
        return False
    manifest = Manifest.decode(_payload(reply), 1 << 30)
    return all(_handle(server, peer, [_state_request(h, i)]) for i, h in enumerate(manifest.hashes))


def test_one_identity_cannot_pull_the_state_again_and_again() -> None:
    """Finding 5: one identity pulled the full state 142 times in 45 s; now a few times a minute,
    while another requester is still served."""
    g = torch.Generator().manual_seed(0)
    data = serialize_state({"w": torch.randn(300, 100, generator=g)}, {"round": 2})
    server = ChunkServer(_Node(), "r", ByteLedger(), chunk_bytes=MIN_CHUNK)
    server.bucket = TokenBucket(0.0, 0.0)  # no global rate: the per-requester share is what holds
    state_hash = hashlib.sha256(data).digest()
    server.put(state_hash, data)
    pulls = [_pull(server, "greedy", state_hash) for _ in range(STATES_PER_MINUTE + 3)]
    assert pulls[:STATES_PER_MINUTE] == [True] * STATES_PER_MINUTE and not any(pulls[STATES_PER_MINUTE:])
    assert _pull(server, "newcomer", state_hash)


def test_one_identity_cannot_take_unbounded_probe_bytes() -> None:
    """Finding 5: one outsider had a peer upload 11.1 GiB of probe data in 60 s."""
    server = ProbeServer(_Node())
    stream = [encode_download(4 << 20)] * 2  # 8 MiB, a stream's most
    served = sum(len(_handle(server, "greedy", stream)) for _ in range(6))
    assert PROBE_BYTES_PER_MINUTE <= served < PROBE_BYTES_PER_MINUTE + (1 << 20)
    assert len(_handle(server, "doctor", [encode_download(1 << 20)])) > 1 << 20  # another requester
