"""Chunked state sync, pure logic: the chunk plan, the manifest decoder's bounds, the resume
bookkeeping (verified chunks kept, bad ones re-queued, donors dropped) and the donor's rate limiter."""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import pytest
import torch

from peers.state.state_chunks import (
    MIN_CHUNK,
    ChunkProgress,
    Manifest,
    TokenBucket,
    build_manifest,
    chunk_plan,
)
from peers.state.state_transfer import serialize_state
from swarmtrain.core.errors import ProtocolError


def _state(seed: int, meta: dict[str, object]) -> bytes:
    g = torch.Generator().manual_seed(seed)
    return serialize_state({"w": torch.randn(300, 100, generator=g), "b": torch.randn(7, generator=g)}, meta)


def test_chunk_plan_covers_header_then_data_without_gaps() -> None:
    plan = chunk_plan(100, 1000, 300)
    assert plan == [(0, 100), (100, 300), (400, 300), (700, 300)]
    plan = chunk_plan(700, 1000, 300)
    assert plan == [(0, 300), (300, 300), (600, 100), (700, 300)]  # header pieces, then data
    for bad in [(0, 10, 4), (11, 10, 4), (5, 10, 0)]:
        with pytest.raises(ProtocolError):
            chunk_plan(*bad)


def test_data_chunks_match_across_donors_whose_headers_differ() -> None:
    """Two donors of the same round: same tensors, different meta (time): only the header chunk differs."""
    a, b = _state(1, {"round": 3, "time": 1.0}), _state(1, {"round": 3, "time": 123456.789, "x": "longer"})
    ma = build_manifest(a, hashlib.sha256(a).digest(), MIN_CHUNK)
    mb = build_manifest(b, hashlib.sha256(b).digest(), MIN_CHUNK)
    assert ma.header_end != mb.header_end and len(ma.hashes) > 3
    assert ma.hashes[0] != mb.hashes[0] and ma.hashes[1:] == mb.hashes[1:]


def test_manifest_round_trips_and_refuses_malformed_input() -> None:
    data = _state(2, {"round": 1})
    m = build_manifest(data, hashlib.sha256(data).digest(), MIN_CHUNK)
    assert Manifest.decode(m.encode(), len(data)) == m
    with pytest.raises(ProtocolError):
        Manifest.decode(m.encode(), len(data) - 1)  # over the caller's size cap
    bad = [
        [m.state_hash, m.nbytes, m.chunk_bytes, m.header_end, list(m.hashes[:-1])],  # a hash missing
        [m.state_hash, m.nbytes, 1, m.header_end, list(m.hashes)],  # chunk size under the floor
        [m.state_hash[:5], m.nbytes, m.chunk_bytes, m.header_end, list(m.hashes)],
        [m.state_hash, m.nbytes, m.chunk_bytes, m.nbytes + 1, list(m.hashes)],
        [m.state_hash, m.nbytes, m.chunk_bytes, m.header_end, [b"x"] * len(m.hashes)],
        {"hash": m.state_hash},
    ]
    for obj in bad:
        with pytest.raises(ProtocolError):
            Manifest.decode(msgpack.packb(obj, use_bin_type=True), len(data))
    with pytest.raises(ProtocolError):
        Manifest.decode(b"\xff" * 10, len(data))


def _manifest(n: int) -> tuple[Manifest, list[bytes]]:
    chunks = [bytes([i]) * MIN_CHUNK for i in range(n)]
    hashes = tuple(hashlib.sha256(c).digest() for c in chunks)
    return Manifest(b"s" * 32, 9 + (n - 1) * MIN_CHUNK, MIN_CHUNK, 9, hashes), chunks


def test_progress_splits_chunks_between_donors_by_what_they_hold() -> None:
    m, chunks = _manifest(5)
    p = ChunkProgress()
    p.plan(m)
    has_b = frozenset(m.hashes[2:])
    assert p.take("A", None) == 0 and p.take("B", has_b) == 2 and p.take("B", has_b) == 3
    assert p.take("A", None) == 1
    assert all(p.verify(i, d, chunks[i]) for i, d in [(0, "A"), (2, "B"), (3, "B"), (1, "A")])
    assert p.take("B", has_b) == 4 and p.verify(4, "B", chunks[4])
    assert p.remaining == 0 and p.by_donor == {"A": 2, "B": 3}
    assert p.assemble() == b"".join(chunks)


def test_a_wrong_chunk_is_rejected_its_donor_dropped_and_the_chunk_queued_again() -> None:
    m, chunks = _manifest(3)
    p = ChunkProgress()
    p.plan(m)
    assert p.take("liar", None) == 0
    assert not p.verify(0, "liar", b"\x07" * MIN_CHUNK)
    assert p.rejected["liar"] == 1 and "liar" in p.dropped and p.take("liar", None) is None
    assert p.take("honest", None) == 0 and p.verify(0, "honest", chunks[0])
    assert p.store[m.hashes[0]] == chunks[0] and p.by_donor["liar"] == 0


def test_resume_after_a_donor_dies_fetches_only_what_is_missing() -> None:
    """A donor breaks off mid-download: its chunk in flight goes back to the queue; the chunks already
    verified stay, and a new attempt (another primary, same content) plans only the missing ones."""
    m, chunks = _manifest(6)
    p = ChunkProgress()
    p.plan(m)
    for _ in range(3):
        i = p.take("dead", None)
        assert i is not None and p.verify(i, "dead", chunks[i])
    i = p.take("dead", None)
    assert i == 3
    p.failed(i, "dead")
    assert "dead" in p.dropped and p.remaining == 3 and p.take("dead", None) is None
    assert not p.could_take("dead", None) and p.could_take("other", None)
    p.plan(m)  # the next attempt
    assert p.remaining == 3
    while (j := p.take("other", None)) is not None:
        assert p.verify(j, "other", chunks[j])
    assert p.remaining == 0 and set(p.fetches.values()) == {1} and p.by_donor == {"dead": 3, "other": 3}
    assert p.assemble() == b"".join(chunks)


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_holds_the_rate_after_the_burst() -> None:
    clock = _Clock()
    b = TokenBucket(1000.0, 500.0, clock)
    assert b.reserve(500) == 0.0  # the burst
    assert b.reserve(1000) == pytest.approx(1.0)  # a second's worth of debt
    assert b.reserve(500) == pytest.approx(1.5)  # queued behind the previous reservation
    clock.t = 10.0  # long idle: back to a full burst, never more
    assert b.reserve(500) == 0.0 and b.reserve(100) == pytest.approx(0.1)
    assert TokenBucket(0.0, 1.0, clock).reserve(10**9) == 0.0  # rate 0: unlimited


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
    def __init__(self, ok: bool) -> None:
        self.ok = ok

    async def acheck(self, peer: str) -> bool:
        return self.ok


class _Node:
    def __init__(self, ok: bool = True) -> None:
        self.admitted = _Admitted(ok)
        self.loop = self
        self.p2p = self

    def run(self, coro: Any, timeout: float) -> None:
        coro.close()

    async def add_binary_stream_handler(self, name: str, handler: Any) -> None:
        return None


class _Info:
    class peer_id:  # noqa: N801 - the shape of hivemind's PeerInfo
        @staticmethod
        def to_base58() -> str:
            return "newcomer"


def _serve(server: Any, digest: bytes, index: int) -> bytes:
    """What ``server`` answers to one request; empty when it refused."""
    import asyncio

    from peers.wire.messages import Envelope, encode_envelope
    from peers.wire.transport import write_frame

    req = _Writer()
    env = Envelope(type="state_req", run="r", kind="state", round=-1, digest=digest, index=index)
    write_frame(req, encode_envelope(env))  # type: ignore[arg-type]

    async def go() -> bytes:
        reader = asyncio.StreamReader()
        reader.feed_data(bytes(req.out))
        reader.feed_eof()
        w = _Writer()
        await server._handle(_Info(), reader, w)
        return bytes(w.out)

    return asyncio.run(go())


def test_donor_charges_every_served_chunk_to_its_rate_limit_and_serves_only_what_it_holds() -> None:
    from peers.state.state_chunks import ChunkServer
    from peers.wire.ledger import ByteLedger

    data = _state(3, {"round": 2})
    server = ChunkServer(_Node(), "r", ByteLedger(), upload_rate=1000.0, chunk_bytes=MIN_CHUNK)
    clock = _Clock()
    server.bucket = TokenBucket(1e9, 0.0, clock)  # no burst, a clock that stands still: no sleeping
    mh = server.put(hashlib.sha256(data).digest(), data)
    manifest = Manifest.decode(_payload(_serve(server, hashlib.sha256(data).digest(), -1)), len(data))
    assert hashlib.sha256(manifest.encode()).digest() == mh
    got = _payload(_serve(server, manifest.hashes[1], 1))
    assert hashlib.sha256(got).digest() == manifest.hashes[1]
    charged = -server.bucket.tokens
    assert charged == len(manifest.encode()) + len(got), "served bytes not charged to the rate limit"
    assert _serve(server, b"\x01" * 32, 0) == b""  # a chunk it does not hold: refused
    refusing = ChunkServer(_Node(ok=False), "r", ByteLedger(), chunk_bytes=MIN_CHUNK)
    refusing.put(hashlib.sha256(data).digest(), data)
    assert _serve(refusing, manifest.hashes[1], 1) == b""  # not admitted: nothing served


def _payload(reply: bytes) -> bytes:
    """The data frames of a server's reply (header frame skipped)."""
    from peers.wire.messages import decode_envelope
    from peers.wire.transport import FRAME_PREFIX, decode_frame_length

    n = decode_frame_length(reply[:FRAME_PREFIX], 1 << 20)
    env = decode_envelope(reply[FRAME_PREFIX : FRAME_PREFIX + n])
    out, at = b"", FRAME_PREFIX + n
    for _ in range(env.frames):
        k = decode_frame_length(reply[at : at + FRAME_PREFIX], 1 << 30)
        out += reply[at + FRAME_PREFIX : at + FRAME_PREFIX + k]
        at += FRAME_PREFIX + k
    return out


def test_progress_holds_at_most_one_states_chunks() -> None:
    """Attempts at states of other rounds do not pile up: chunks the new manifest does not list go."""
    m, chunks = _manifest(4)
    p = ChunkProgress()
    p.plan(m)
    for i in range(4):
        assert p.take("A", None) == i and p.verify(i, "A", chunks[i])
    other = Manifest(
        b"t" * 32, m.nbytes, m.chunk_bytes, m.header_end, (m.hashes[0], b"z" * 32, *m.hashes[2:])
    )
    p.plan(other)
    assert set(p.store) == {m.hashes[0], *m.hashes[2:]} and p.remaining == 1


def test_mutated_manifests_parse_or_raise_protocol_error_only() -> None:
    import random

    data = _state(4, {"round": 1})
    good = build_manifest(data, hashlib.sha256(data).digest(), MIN_CHUNK).encode()
    rng = random.Random(0)
    for _ in range(2000):
        b = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cut = bytes(b[: rng.randint(0, len(b))]) if rng.random() < 0.2 else bytes(b)
        try:
            m = Manifest.decode(cut, len(data))
        except ProtocolError:
            continue
        assert len(m.hashes) == len(m.plan) and m.nbytes <= len(data)


def test_announcement_carries_a_32_byte_manifest_hash_or_none() -> None:
    from peers.state.state_transfer import parse_announcement

    def ann(**extra: object) -> bytes:
        return bytes(msgpack.packb({"hash": b"h" * 32, "nbytes": 10, "round": 1, **extra}, use_bin_type=True))

    assert parse_announcement(ann(manifest=b"m" * 32))[4] == b"m" * 32
    assert parse_announcement(ann())[4] is None  # an older donor: skipped by the download
    for bad in (b"m" * 5, "m" * 32, 7):
        with pytest.raises(ProtocolError):
            parse_announcement(ann(manifest=bad))
