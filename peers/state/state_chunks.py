"""Chunked state sync: a state download split in chunks, pulled from several donors at once.

A donor's snapshot (``peers.state.state_transfer``: safetensors bytes, SHA-256 ``state_hash``) is cut by
:func:`chunk_plan` into pieces of :data:`CHUNK_BYTES`: the safetensors header alone, then the tensor
data from its start. Donors holding the same tensors (the peers that committed the same round) have
the same data layout, so their data chunks hash alike even when their headers (meta) differ; chunks
are asked for by their hash, so any donor that holds a chunk can serve it.

The :class:`Manifest` (state hash, size, chunk size, header end, every chunk's SHA-256) is announced
by its own hash next to the state hash in the donor's signed DHT announcement, the one that vouches
for the round's shared-parameter digest. A newcomer fetches the manifest from its primary donor and
checks it against that hash, then pulls the chunks from all donors of that round in parallel
(:func:`fetch_state`), checks each chunk's hash on arrival, and finally checks the whole state's
hash; the caller checks the parsed state against the digest the donors vouch for. A chunk with a wrong
hash drops its donor for the rest of the download and goes back to the queue; a donor that breaks off
likewise; verified chunks stay in :class:`ChunkProgress` (content-addressed), so the next attempt, from
other donors, fetches only what is missing.

A donor serves chunks through a ``TokenBucket`` (``peers.wire.budgets``) shared by all its requests
(``upload_rate`` bytes/s), so a crowd of newcomers cannot take the link its own rounds need, and
gives each requester at most :data:`STATES_PER_MINUTE` full states a minute (a ``RequesterBudget``),
so one identity cannot take the whole of that link from real newcomers.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgpack

from peers.wire.budgets import RequesterBudget, TokenBucket
from peers.wire.ledger import STATE_ROUND, ByteLedger
from peers.wire.messages import Envelope, decode_envelope, encode_envelope
from peers.wire.transport import (
    PART_BYTES,
    read_data_frames,
    read_envelope,
    split_bytes,
    widen_send_buffer,
    write_frame,
    write_frame_drained,
)
from swarmtrain.core.errors import ProtocolError, SwarmError
from swarmtrain.core.safe_msgpack import unpack

__all__ = [
    "CHUNK_BYTES",
    "ChunkProgress",
    "ChunkServer",
    "Manifest",
    "TokenBucket",
    "build_manifest",
    "chunk_plan",
    "fetch_state",
]

logger = logging.getLogger(__name__)
KIND = "state"
CHUNK_BYTES = 1 << 20  # 1 MiB: ~20 chunks for the tiny preset's state, fine-grained enough to balance
MIN_CHUNK, MAX_CHUNK = 16 << 10, 16 << 20  # chunk sizes a newcomer accepts from a donor's manifest
MAX_CHUNKS = 1 << 16  # chunks in one manifest: 2 MiB of hashes at most
MAX_MANIFEST = MAX_CHUNKS * 33 + 1024
WORKERS_PER_DONOR = 2  # streams in flight per donor: one waits on the wire while the other is served
MAX_DONORS = 4  # donors one download pulls from
STATES_PER_MINUTE = 3  # largest snapshots one requester may pull per minute (a retry, a restart)
_FRAME_TIMEOUT = 30.0
_MANIFEST, _CHUNK = -1, 0  # Envelope.index of a manifest request; a chunk request carries its index


def chunk_plan(header_end: int, nbytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each chunk of a state of ``nbytes`` whose header ends at
    ``header_end``: the header in pieces of ``chunk_bytes``, then the data from ``header_end`` in
    pieces of ``chunk_bytes`` (the same data layout gives the same chunks whatever the header).

    Raises:
        ProtocolError: sizes out of range.
    """
    if not (0 < header_end <= nbytes and chunk_bytes > 0):
        raise ProtocolError("chunk plan sizes out of range")
    out = []
    for lo, hi in ((0, header_end), (header_end, nbytes)):
        out += [(o, min(chunk_bytes, hi - o)) for o in range(lo, hi, chunk_bytes)]
    return out


class ChunksLeft(SwarmError):
    """A donor answered with its manifest, but some of its chunks did not come (streams broke off):
    the donor is alive, and a next pass can fetch what is left."""


@dataclass(frozen=True)
class Manifest:
    """What a donor's snapshot consists of: its hash, size, chunk size, header end, chunk hashes."""

    state_hash: bytes
    nbytes: int
    chunk_bytes: int
    header_end: int
    hashes: tuple[bytes, ...]

    def encode(self) -> bytes:
        item = [self.state_hash, self.nbytes, self.chunk_bytes, self.header_end, list(self.hashes)]
        return bytes(msgpack.packb(item, use_bin_type=True))

    @property
    def plan(self) -> list[tuple[int, int]]:
        return chunk_plan(self.header_end, self.nbytes, self.chunk_bytes)

    @classmethod
    def decode(cls, data: bytes, max_bytes: int) -> Manifest:
        """Parse a manifest from a peer: bounded msgpack, sizes within ``max_bytes`` and the chunk
        limits, as many 32-byte hashes as the plan has chunks.

        Raises:
            ProtocolError: anything else.
        """
        if len(data) > MAX_MANIFEST:
            raise ProtocolError("state manifest too large")
        obj = unpack(
            data, what="state manifest", max_bytes=MAX_MANIFEST, max_str=0, max_bin=32, max_array=MAX_CHUNKS
        )
        if not (isinstance(obj, list) and len(obj) == 5):
            raise ProtocolError("state manifest is not a 5-list")
        h, n, c, e, hs = obj
        if not (isinstance(h, bytes) and len(h) == 32 and all(isinstance(x, int) for x in (n, c, e))):
            raise ProtocolError("state manifest fields ill-typed")
        if not (0 < n <= max_bytes and MIN_CHUNK <= c <= MAX_CHUNK and 8 < e <= n):
            raise ProtocolError("state manifest sizes out of range")
        if not (isinstance(hs, list) and all(isinstance(x, bytes) and len(x) == 32 for x in hs)):
            raise ProtocolError("state manifest hashes are not 32-byte strings")
        m = cls(h, n, c, e, tuple(hs))
        if len(hs) != len(m.plan):
            raise ProtocolError("state manifest hash count differs from its chunk plan")
        return m


def build_manifest(data: bytes | memoryview, state_hash: bytes, chunk_bytes: int = CHUNK_BYTES) -> Manifest:
    """The manifest of our own safetensors snapshot ``data``."""
    (hlen,) = struct.unpack("<Q", bytes(data[:8]))
    header_end = 8 + hlen
    view = memoryview(data)
    plan = chunk_plan(header_end, len(data), chunk_bytes)
    hashes = tuple(hashlib.sha256(view[o : o + n]).digest() for o, n in plan)
    return Manifest(state_hash, len(data), chunk_bytes, header_end, hashes)


@dataclass
class ChunkProgress:
    """Bookkeeping of a chunked download, kept across attempts so that verified chunks are never
    fetched again: ``store`` maps chunk hashes to verified bytes (content-addressed, so a chunk
    verified for one donor's manifest counts for any other that lists it)."""

    store: dict[bytes, bytes] = field(default_factory=dict)
    by_donor: Counter[str] = field(default_factory=Counter)  # verified chunks per donor
    fetches: Counter[bytes] = field(default_factory=Counter)  # verified fetches per chunk hash
    rejected: Counter[str] = field(default_factory=Counter)  # chunks with a wrong hash per donor
    dropped: set[str] = field(default_factory=set)  # donors dropped (broke off or lied)
    log: list[tuple[int, str]] = field(default_factory=list)  # (chunk index, donor) as verified
    _pending: list[int] = field(default_factory=list)
    _hashes: tuple[bytes, ...] = ()
    _inflight: dict[int, str] = field(default_factory=dict)

    def plan(self, manifest: Manifest) -> None:
        """Start (or resume) fetching ``manifest``: pending are the chunks not verified yet. Verified
        chunks it does not list are let go: what is held never exceeds one state."""
        self._hashes = manifest.hashes
        listed = set(manifest.hashes)
        self.store = {h: d for h, d in self.store.items() if h in listed}
        self._pending = [i for i, h in enumerate(self._hashes) if h not in self.store]
        self._inflight = {}

    @property
    def remaining(self) -> int:
        return len(self._pending) + len(self._inflight)

    def take(self, donor: str, has: frozenset[bytes] | None) -> int | None:
        """The next chunk for ``donor`` (the lowest pending index it holds; ``has=None``: all)."""
        if donor in self.dropped:
            return None
        for k, i in enumerate(self._pending):
            if has is None or self._hashes[i] in has:
                del self._pending[k]
                self._inflight[i] = donor
                return i
        return None

    def could_take(self, donor: str, has: frozenset[bytes] | None) -> bool:
        """Whether ``donor`` may yet get a chunk: one it holds is pending or in flight elsewhere."""
        if donor in self.dropped:
            return False
        idx = self._pending + list(self._inflight)
        return any(has is None or self._hashes[i] in has for i in idx)

    def verify(self, i: int, donor: str, data: bytes) -> bool:
        """Chunk ``i`` arrived from ``donor``: kept when its hash matches, else the donor is dropped
        and the chunk goes back to the queue. Returns whether it was kept."""
        self._inflight.pop(i, None)
        h = self._hashes[i]
        if hashlib.sha256(data).digest() != h:
            self.rejected[donor] += 1
            self.drop(donor)
            self._requeue(i)
            return False
        self.store[h] = data
        self.by_donor[donor] += 1
        self.fetches[h] += 1
        self.log.append((i, donor))
        return True

    def failed(self, i: int, donor: str) -> None:
        """Fetching chunk ``i`` from ``donor`` broke off: drop the donor, queue the chunk again."""
        self._inflight.pop(i, None)
        self.drop(donor)
        self._requeue(i)

    def drop(self, donor: str) -> None:
        self.dropped.add(donor)

    def _requeue(self, i: int) -> None:
        if self._hashes[i] not in self.store and i not in self._pending:
            self._pending.append(i)
            self._pending.sort()

    def assemble(self) -> bytes:
        """The state's bytes, once every chunk is verified."""
        return b"".join(self.store[h] for h in self._hashes)


def _handler_name(run_id: str) -> str:
    return f"swarmtrain.{run_id}.chunks"


class ChunkServer:
    """Serves the manifests and chunks of a donor's last ``keep`` snapshots, at ``upload_rate``
    bytes/s at most over all requests (``<= 0``: unlimited)."""

    def __init__(
        self,
        node: Any,
        run_id: str,
        ledger: ByteLedger,
        *,
        keep: int = 2,
        upload_rate: float = 0.0,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.node, self.run_id, self.ledger, self.keep = node, run_id, ledger, max(1, keep)
        self.chunk_bytes = chunk_bytes
        self.bucket = TokenBucket(upload_rate, max(float(chunk_bytes), upload_rate / 4))
        self.budget, self._share = RequesterBudget(0.0), 0.0  # per requester
        self._snaps: OrderedDict[bytes, tuple[bytes, bytes, Manifest]] = OrderedDict()  # by state hash
        self._index: dict[bytes, tuple[bytes, int, int]] = {}  # chunk hash -> (state hash, off, len)
        self.served_chunks = 0
        node.loop.run(node.p2p.add_binary_stream_handler(_handler_name(run_id), self._handle), 15.0)

    def put(self, state_hash: bytes, data: bytes) -> bytes:
        """Hold snapshot ``data`` (dropping the oldest beyond ``keep``); returns its manifest's hash.
        Called from the training thread: the dictionaries are replaced, never mutated in place, so
        the event loop's handler reads a consistent pair."""
        m = build_manifest(data, state_hash, self.chunk_bytes)
        encoded = m.encode()
        snaps = OrderedDict(self._snaps)
        snaps[state_hash] = (data, encoded, m)
        while len(snaps) > self.keep:
            snaps.popitem(last=False)
        index = {}
        for sh, (_, _, man) in snaps.items():
            for h, (o, n) in zip(man.hashes, man.plan, strict=True):
                index[h] = (sh, o, n)
        self._snaps, self._index = snaps, index
        self._share = STATES_PER_MINUTE * max(len(d) + len(e) for d, e, _ in snaps.values())
        return hashlib.sha256(encoded).digest()

    def chunk(self, h: bytes) -> bytes | None:
        """The bytes of the chunk with hash ``h`` (``None``: not held)."""
        at = self._index.get(h)
        snap = self._snaps.get(at[0]) if at is not None else None
        if at is None or snap is None:
            return None
        return snap[0][at[1] : at[1] + at[2]]

    async def _handle(self, info: Any, reader: Any, writer: Any) -> None:
        sender = str(info.peer_id.to_base58())
        sent = received = 0
        try:
            if not await self.node.admitted.acheck(sender):  # the run's policy (peers.trust.admission)
                raise ProtocolError("not admitted to the run")
            body, received = await read_envelope(reader, _FRAME_TIMEOUT)
            env = decode_envelope(body)
            if env.type != "state_req" or env.run != self.run_id or len(env.digest) != 32:
                raise ProtocolError("expected a state chunk request for this run")
            if env.index == _MANIFEST:
                snap = self._snaps.get(env.digest)
                data = snap[1] if snap is not None else None
            else:
                data = self.chunk(env.digest)
            if data is None:
                raise ProtocolError("requested manifest or chunk is not held (refreshed since)")
            if not self.budget.take(sender, len(data), self._share):
                raise ProtocolError("the requester's share of state bytes for this minute is spent")
            await self.bucket.acquire(len(data))
            frames = split_bytes(data, PART_BYTES)
            hdr = Envelope(
                type="state_hdr",
                run=self.run_id,
                kind=KIND,
                round=STATE_ROUND,
                digest=env.digest,
                index=env.index,
                frames=len(frames),
                nbytes=len(data),
            )
            widen_send_buffer(writer)
            sent += write_frame(writer, encode_envelope(hdr))
            for f in frames:
                sent += await write_frame_drained(writer, f)
            await writer.drain()
            self.served_chunks += env.index != _MANIFEST
        except (SwarmError, ConnectionError, OSError) as e:
            logger.info("state chunk request from %s failed: %s", sender[:16], e)
        finally:
            self.ledger.add_sent(KIND, STATE_ROUND, sent)
            self.ledger.add_received(KIND, STATE_ROUND, received)
            writer.close()

    def close(self) -> None:
        try:
            self.node.loop.run(self.node.p2p.remove_binary_stream_handler(_handler_name(self.run_id)), 5.0)
        except Exception:
            logger.debug("removing the chunk handler failed", exc_info=True)


async def _request(
    node: Any, peer: str, run: str, digest: bytes, index: int, max_bytes: int, ledger: ByteLedger
) -> bytes:
    """One request on a fresh stream: the manifest (``index = -1``) or a chunk's bytes.

    Raises:
        SwarmError: unreachable donor, broken stream, or an answer that is not what was asked.
    """
    from hivemind.p2p import PeerID

    try:
        _, reader, writer = await node.p2p.call_binary_stream_handler(
            PeerID.from_base58(peer), _handler_name(run)
        )
    except Exception as e:
        raise SwarmError(f"cannot reach donor: {type(e).__name__}: {e}") from None
    sent = received = 0
    try:
        req = Envelope(type="state_req", run=run, kind=KIND, round=STATE_ROUND, digest=digest, index=index)
        sent += write_frame(writer, encode_envelope(req))
        await writer.drain()
        body, n = await read_envelope(reader, _FRAME_TIMEOUT)
        received += n
        hdr = decode_envelope(body)
        if hdr.type != "state_hdr" or hdr.digest != digest or hdr.index != index:
            raise ProtocolError("donor answered another request")
        frames, n = await read_data_frames(reader, hdr, max_total=max_bytes, timeout=_FRAME_TIMEOUT)
        received += n
        return b"".join(frames)
    except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
        raise SwarmError(f"stream to donor broke: {type(e).__name__}: {e}") from None
    finally:
        ledger.add_sent(KIND, STATE_ROUND, sent)
        ledger.add_received(KIND, STATE_ROUND, received)
        writer.close()


async def _manifest(
    node: Any, run: str, source: tuple[str, bytes, int, bytes], max_bytes: int, ledger: ByteLedger
) -> Manifest:
    """A donor's manifest, checked against the manifest hash and state hash and size it announced."""
    peer, state_hash, nbytes, manifest_hash = source
    data = await _request(node, peer, run, state_hash, _MANIFEST, MAX_MANIFEST, ledger)
    if hashlib.sha256(data).digest() != manifest_hash:
        raise ProtocolError("state manifest does not match the announced manifest hash")
    m = Manifest.decode(data, max_bytes)
    if m.state_hash != state_hash or m.nbytes != nbytes:
        raise ProtocolError("state manifest names another state than the announced one")
    return m


async def _holds(
    node: Any, run: str, src: tuple[str, bytes, int, bytes], max_bytes: int, ledger: ByteLedger
) -> frozenset[bytes] | None:
    """The chunk hashes another donor of the round holds (its manifest); ``None``: it gave none."""
    try:
        return frozenset((await _manifest(node, run, src, max_bytes, ledger)).hashes)
    except SwarmError as e:
        logger.info("no manifest from donor %s: %s", src[0][:12], e)
        return None


@dataclass
class _Pull:
    """The chunks of one manifest pulled from the donors, by workers sharing ``progress``."""

    node: Any
    run: str
    manifest: Manifest
    progress: ChunkProgress
    ledger: ByteLedger

    async def work(self, donor: str, held: frozenset[bytes] | None) -> None:
        """Take chunks ``donor`` holds (``None``: all) until none is left for it; a failed request
        or a chunk with a wrong hash ends this donor's work."""
        progress, plan = self.progress, self.manifest.plan
        while progress.remaining:
            i = progress.take(donor, held)
            if i is None:
                if not progress.could_take(donor, held):
                    return
                await asyncio.sleep(0.05)  # a chunk in flight elsewhere may come back
                continue
            try:
                data = await _request(
                    self.node, donor, self.run, self.manifest.hashes[i], i, plan[i][1], self.ledger
                )
            except SwarmError as e:
                logger.info("chunk %d from %s failed: %s", i, donor[:12], e)
                progress.failed(i, donor)
                return
            if not progress.verify(i, donor, data):
                logger.warning("donor %s served chunk %d with a wrong hash: dropped", donor[:12], i)
                return


async def fetch_state(
    node: Any,
    run: str,
    sources: list[tuple[str, bytes, int, bytes]],
    ledger: ByteLedger,
    progress: ChunkProgress,
    *,
    max_bytes: int,
) -> bytes:
    """Download the state ``sources[0]`` announced, ``(peer, state_hash, nbytes, manifest_hash)``,
    chunk by chunk from every source that holds its chunks (the others are donors of the same round).

    Raises:
        SwarmError: the primary's manifest is unusable.
        ChunksLeft: chunks are left that no remaining donor served (the verified ones stay in
            ``progress`` for the next attempt).
    """
    primary = sources[0]
    manifest = await _manifest(node, run, primary, max_bytes, ledger)
    progress.plan(manifest)
    has: dict[str, frozenset[bytes] | None] = {primary[0]: None}
    others = [s for s in sources[1:MAX_DONORS] if s[0] not in progress.dropped and s[0] != primary[0]]
    held = await asyncio.gather(*(_holds(node, run, s, max_bytes, ledger) for s in others))
    has.update((s[0], h) for s, h in zip(others, held, strict=True) if h is not None)
    plan = manifest.plan
    pull = _Pull(node, run, manifest, progress, ledger)
    await asyncio.gather(
        *(pull.work(d, has[d]) for _ in range(WORKERS_PER_DONOR) for d in has)
    )  # each donor first
    if progress.remaining:
        raise ChunksLeft(f"{progress.remaining} of {len(plan)} chunks left that no live donor serves")
    data = progress.assemble()
    if hashlib.sha256(data).digest() != primary[1]:
        raise ProtocolError("assembled state does not match the announced hash")
    logger.info(
        "state of %d bytes in %d chunks from %d donors (%s)",
        len(data),
        len(plan),
        len([d for d in has if progress.by_donor[d]]),
        ", ".join(f"{d[:8]}: {progress.by_donor[d]}" for d in has),
    )
    return data
