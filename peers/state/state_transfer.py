"""State download for newcomers: donors serve a safetensors snapshot over streams, announced by hash.

A donor runs a :class:`StateServer` with a *provider* callable returning ``(tensors, meta)``: the
model, the outer optimizer state flattened to named tensors, and JSON-able ``meta`` that includes the
``round`` number. ``refresh()`` serialises a snapshot with ``safetensors`` (meta goes into the file's
metadata, so the hash covers it), keeps the last few snapshots by SHA-256 and announces
``{hash, nbytes, round, manifest}`` under ``"<run_id>.state"`` in the DHT. :func:`download_state`
picks the donor with the highest round, pulls exactly the announced state in chunks from it and the
other donors of that round in parallel (``peers.state.state_chunks``: manifest checked against the
announced hash, every chunk by its hash, the whole by the state hash; donors rate-limited), and
parses it with ``safetensors.torch.load`` (never ``torch.load``/pickle). Bytes are counted in the
ledger as kind ``"state"``.

A donor's announcement also *vouches* for the ``(round, digest)`` of the last few states it committed
itself (the digest of the parameters every peer must agree on). With ``vouchers = k`` a newcomer takes
a state only when ``min(k, donors)`` distinct admitted donors vouch for the same round and digest, and
its ``check`` confirms the downloaded state has that digest: one admitted donor alone cannot plant a
state (two colluding ones can, with ``k = 2``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgpack
import torch

from peers.dht.node import PeerNode, dht_time
from peers.state.state_chunks import CHUNK_BYTES, MAX_DONORS, ChunkProgress, ChunkServer, fetch_state
from peers.wire.ledger import ByteLedger
from swarmtrain.core.errors import ConfigError, PeerTimeoutError, ProtocolError, SwarmError
from swarmtrain.core.safe_msgpack import unpack

__all__ = [
    "StateServer",
    "download_state",
    "freshest_vouched",
    "decode_announcement",
    "NoStateAnnounced",
    "StateProvider",
    "state_key",
    "META_KEY",
]

logger = logging.getLogger(__name__)
StateProvider = Callable[[], tuple[Mapping[str, torch.Tensor], Mapping[str, Any]]]
META_KEY = "swarmtrain"
_MAX_ANNOUNCEMENT = 1024  # bytes of one donor's DHT announcement
MAX_VOUCHES = 4  # (round, digest) pairs one announcement vouches for: its recent committed states


class NoStateAnnounced(PeerTimeoutError):
    """Nobody announced a state to download: the run has none yet (its first peer starts it)."""


def state_key(run_id: str) -> str:
    """DHT key of the state announcements of ``run_id``."""
    return f"{run_id}.state"


def serialize_state(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> bytes:
    """``safetensors`` bytes of ``tensors`` with ``meta`` (JSON) in the file metadata."""
    from safetensors.torch import save

    clean = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    try:
        meta_json = json.dumps(dict(meta), sort_keys=True)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"state meta must be JSON-serialisable: {e}") from None
    return bytes(save(clean, metadata={META_KEY: meta_json}))


def parse_state(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Parse safetensors bytes from a peer: ``(tensors, meta)``.

    Raises:
        ProtocolError: malformed header, metadata or tensors.
    """
    from safetensors.torch import load

    if len(data) < 8:
        raise ProtocolError("state too short")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > min(len(data) - 8, 100 << 20):
        raise ProtocolError("state header length out of range")
    try:
        header = json.loads(data[8 : 8 + hlen])
        meta = json.loads(header.get("__metadata__", {}).get(META_KEY, "{}"))
    except (ValueError, AttributeError, TypeError) as e:
        raise ProtocolError(f"state header is not valid JSON: {e}") from None
    except RecursionError:  # json.loads recurses once per nesting level
        raise ProtocolError("state header nests too deeply") from None
    if not isinstance(meta, dict):
        raise ProtocolError("state meta is not a JSON object")
    try:
        tensors = load(data)
    except Exception as e:  # safetensors raises its own error types on bad input
        raise ProtocolError(f"state tensors do not parse: {type(e).__name__}: {e}") from None
    return dict(tensors), meta


class StateServer:
    """Serves this peer's state to newcomers.

    Args:
        node: the started peer node.
        provider: returns ``(tensors, meta)``; ``meta["round"]`` (int) is required.
        run_id: default: the node's run ID.
        ledger: default: ``node.ledger``.
        keep: snapshots kept (a newcomer may ask for the previous one while we refresh).
        announce_ttl: seconds an announcement lives; re-announced every third of it.
        upload_rate: bytes/s this donor serves at most, all newcomers together (0: unlimited).
        chunk_bytes: chunk size of its manifests (``peers.state.state_chunks``).
    """

    def __init__(
        self,
        node: PeerNode,
        provider: StateProvider,
        *,
        run_id: str | None = None,
        ledger: ByteLedger | None = None,
        keep: int = 2,
        announce_ttl: float = 60.0,
        upload_rate: float = 0.0,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self.node = node
        self.provider = provider
        self.run_id = run_id or node.run_id
        self.ledger = ledger if ledger is not None else node.ledger
        self.keep = max(1, keep)
        self.announce_ttl = announce_ttl
        self._latest: tuple[bytes, int, int, bytes] | None = None  # (hash, nbytes, round, manifest)
        #: (round, shared-parameter digest) of the last states this peer committed itself
        self._vouches: list[tuple[int, bytes]] = []
        self.leaving = False  # announced too: a peer about to leave is nobody's holder of the state
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.chunks = ChunkServer(
            node, self.run_id, self.ledger, keep=self.keep, upload_rate=upload_rate, chunk_bytes=chunk_bytes
        )
        self._thread = threading.Thread(
            target=self._reannounce, name="swarmtrain-state-announce", daemon=True
        )
        self._thread.start()

    def refresh(self, vouch: str | None = None) -> str:
        """Snapshot the provider's state now (call it from the training thread between steps) and
        announce it. Returns the SHA-256 hex digest.

        ``vouch``: the hex SHA-256 of the parameters every peer must agree on, when this state is one
        this peer committed itself, or one it downloaded that at least two donors (and at least
        ``vouchers``) vouched for alike: the announcement then vouches for ``(round, vouch)``, and a
        newcomer takes a state only when enough donors vouch for it (:func:`download_state`'s
        ``vouchers``). A state one donor alone vouched for is never vouched for again."""
        tensors, meta = self.provider()
        rnd = meta.get("round")
        if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
            raise ConfigError("state meta needs an integer 'round' >= 0")
        data = serialize_state(tensors, meta)
        digest = hashlib.sha256(data).digest()
        manifest = self.chunks.put(digest, data)
        with self._lock:
            self._latest = (digest, len(data), rnd, manifest)
            if vouch is not None:
                self._vouches = [*self._vouches, (rnd, bytes.fromhex(vouch))][-MAX_VOUCHES:]
        self._announce()
        return digest.hex()

    @property
    def announced_round(self) -> int | None:
        """The round of the state this peer announces (``None``: none yet)."""
        with self._lock:
            return None if self._latest is None else self._latest[2]

    def announce_leaving(self) -> None:
        """Say in the announcement that this peer is about to leave (it still serves its state)."""
        self.leaving = True
        self._announce()

    def _announce(self) -> None:
        with self._lock:
            latest = self._latest
            if latest is None:
                return
            vouches = [[r, d] for r, d in self._vouches]
        item = {"hash": latest[0], "nbytes": latest[1], "round": latest[2], "vouch": vouches}
        item["manifest"] = latest[3]
        if self.leaving:
            item["leaving"] = True
        value = msgpack.packb(item, use_bin_type=True)
        try:
            self.node.dht.store(
                state_key(self.run_id),
                value,
                dht_time() + self.announce_ttl,
                subkey=self.node.peer_id,
                return_future=True,
            ).result(15.0)
        except Exception as e:
            logger.warning("announcing the state failed: %s", e)

    def _reannounce(self) -> None:
        while not self._stop.wait(self.announce_ttl / 3.0):
            self._announce()

    def close(self) -> None:
        """Stop serving and announcing."""
        self._stop.set()
        self.chunks.close()

    @property
    def served(self) -> int:
        """Chunks served so far."""
        return self.chunks.served_chunks

    def __enter__(self) -> StateServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def decode_announcement(value: Any) -> tuple[bytes, int, int]:
    """Parse a donor's DHT announcement ``{hash, nbytes, round, vouch}``: ``(sha256, nbytes, round)``.

    Raises:
        ProtocolError: not bytes, over 1 KiB, not bounded msgpack, or fields missing or ill-typed.
    """
    h, n, r = parse_announcement(value)[:3]
    return h, n, r


Vouches = frozenset[tuple[int, bytes]]


def parse_announcement(value: Any) -> tuple[bytes, int, int, Vouches, bytes | None]:
    """:func:`decode_announcement` plus the ``(round, digest)`` pairs the donor vouches for (at most
    :data:`MAX_VOUCHES`; an announcement without them vouches for nothing) and the hash of the state's
    chunk manifest (``peers.state.state_chunks``; ``None``: an older donor, whose state cannot be pulled).

    Raises:
        ProtocolError: as :func:`decode_announcement`, or a malformed ``vouch`` list.
    """
    if not isinstance(value, bytes) or len(value) > _MAX_ANNOUNCEMENT:
        raise ProtocolError("state announcement is not bytes or too large")
    obj = unpack(
        value,
        what="state announcement",
        max_bytes=_MAX_ANNOUNCEMENT,
        max_str=64,
        max_bin=64,
        max_array=_MAX_ANNOUNCEMENT,  # the vouch list is checked below; the length bounds any array
        max_map=8,
    )
    if not isinstance(obj, dict):
        raise ProtocolError("state announcement is not a map")
    h, n, r = obj.get("hash"), obj.get("nbytes"), obj.get("round")
    if not (isinstance(h, bytes) and len(h) == 32 and isinstance(n, int) and isinstance(r, int) and n > 0):
        raise ProtocolError("state announcement fields missing or ill-typed")
    raw = obj.get("vouch", [])
    if not isinstance(raw, list) or len(raw) > MAX_VOUCHES:
        raise ProtocolError(f"state announcement vouches for more than {MAX_VOUCHES} states")
    vouches = set()
    for v in raw:
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], int) and v[0] >= 0):
            raise ProtocolError("state announcement vouch is not [round, digest]")
        if not (isinstance(v[1], bytes) and len(v[1]) == 32):
            raise ProtocolError("state announcement vouch digest is not 32 bytes")
        vouches.add((v[0], v[1]))
    m = obj.get("manifest")
    if m is not None and not (isinstance(m, bytes) and len(m) == 32):
        raise ProtocolError("state announcement manifest hash is not 32 bytes")
    return h, n, r, frozenset(vouches), m


def _announcements(
    node: PeerNode,
    run_id: str,
    timeout: float,
    vouches: dict[str, Vouches] | None = None,
    manifests: dict[str, bytes] | None = None,
) -> list[tuple[int, str, bytes, int]]:
    """Valid announcements ``(round, peer_id, hash, nbytes)``, best (highest round) first; each
    donor's vouches and manifest hash go into ``vouches`` and ``manifests`` (by peer ID) when given."""
    try:
        found = node.dht.get(state_key(run_id), latest=True, return_future=True).result(timeout)
    except TimeoutError:
        return []
    if found is None or not isinstance(found.value, dict):
        return []
    out = []
    for peer, item in found.value.items():
        if peer == node.peer_id:
            continue
        try:
            h, n, r, v, m = parse_announcement(item.value)
        except ProtocolError:
            continue  # one bad announcement is skipped, the others still count
        out.append((r, str(peer), h, n))
        if manifests is not None and m is not None:
            manifests[str(peer)] = m
        if vouches is not None:
            vouches[str(peer)] = v
    return sorted(out, key=lambda a: (-a[0], a[1]))


#: rounds a donor's announcement may be ahead of the most advanced other peer (records are published
#: after a round, announcements right after its commit)
ROUND_SLACK = 2


def _witnessed(
    node: PeerNode, run: str, found: list[tuple[int, str, bytes, int]], errors: list[str]
) -> list[tuple[int, str, bytes, int]]:
    """The announcements whose round the *other* peers bear out: at most :data:`ROUND_SLACK` past the
    highest round any other peer (not the announcer, not this one) announced or published in its
    record. A donor alone cannot claim round 10^12 to be picked first. Other donors' announcements
    count as well as records: records lag (a peer re-publishes its record after a round, and a loaded
    DHT stores it a few rounds late when rounds take a second), announcements do not, so honest donors
    bear each other out. Peers at round 0 (newcomers) are no witnesses; with none, every announcement
    stands."""
    if not found:
        return found
    try:
        records = [(r.peer_id, r.round) for r in node.live_peers(run, timeout=15.0)]
    except SwarmError:
        return found
    rounds = [(p, r) for p, r in records + [(a[1], a[0]) for a in found] if r > 0 and p != node.peer_id]
    out = []
    for a in found:
        seen = [r for p, r in rounds if p != a[1]]
        if seen and a[0] > max(seen) + ROUND_SLACK:
            errors.append(f"{a[1][:12]}: announced round {a[0]}, the others are at {max(seen)}")
            continue
        out.append(a)
    return out


def _vouched(
    found: list[tuple[int, str, bytes, int]], vouches: Mapping[str, Vouches], k: int, errors: list[str]
) -> list[tuple[tuple[int, str, bytes, int], bytes | None]]:
    """The announcements whose state enough independent donors vouch for, each with the digest they
    vouch for: a donor's state of round ``r`` counts when at least ``min(k, donors)`` distinct donors
    (itself included) vouch for the same ``(r, digest)`` that it vouches for; ``donors`` is how many
    distinct donors announced. With one donor (or ``k <= 1``) every announcement stands, with the
    digest it vouches for if any. A lone admitted donor cannot make a newcomer adopt a state the
    others did not commit."""
    donors = {a[1] for a in found}
    need = min(k, len(donors))
    out: list[tuple[tuple[int, str, bytes, int], bytes | None]] = []
    for a in found:
        own = [d for r, d in vouches.get(a[1], frozenset()) if r == a[0]]
        if need <= 1:
            out.append((a, own[0] if len(own) == 1 else None))
            continue
        if len(own) != 1:
            errors.append(f"{a[1][:12]}: its state of round {a[0]} is not one it committed")
            continue
        support = sum(1 for p in donors if (a[0], own[0]) in vouches.get(p, frozenset()))
        if support < need:
            errors.append(f"{a[1][:12]}: round {a[0]} vouched for by {support} of the {need} donors needed")
            continue
        out.append((a, own[0]))
    return out


def _candidates(
    node: PeerNode,
    run: str,
    exclude: frozenset[str],
    vouchers: int,
    errors: list[str],
    manifests: dict[str, bytes] | None = None,
) -> list[tuple[tuple[int, str, bytes, int], bytes | None]]:
    """The announcements a newcomer may take, best (highest round) first, each with the digest the
    donors vouch for: read once, bounded and parsed, then witnessed and vouched for."""
    vouches: dict[str, Vouches] = {}
    found = [a for a in _announcements(node, run, 15.0, vouches, manifests) if a[1] not in exclude]
    found = _witnessed(node, run, found, errors)
    return _vouched(found, vouches, vouchers, errors)


def freshest_vouched(
    node: PeerNode,
    *,
    run_id: str | None = None,
    wait_for_donor: float = 0.0,
    exclude: frozenset[str] = frozenset(),
    vouchers: int = 1,
) -> tuple[int, bytes] | None:
    """The ``(round, shared-parameter digest)`` of the freshest state the run's donors vouch for, by
    the rules :func:`download_state` takes a state by (witnessed round, ``vouchers``); ``None`` when no
    donor announced one within ``wait_for_donor`` seconds or the freshest carries no vouch. A peer
    that holds this very state (its own, saved when it committed that round) needs no download."""
    run = run_id or node.run_id
    deadline = time.monotonic() + wait_for_donor
    while True:
        chosen = _candidates(node, run, exclude, vouchers, [])
        if chosen:
            (rnd, _, _, _), shared = chosen[0]
            return None if shared is None else (rnd, shared)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


#: a callable that checks a downloaded state before it is taken: ``(tensors, meta, digest)`` where
#: ``digest`` is the shared-parameter SHA-256 the donors vouched for (None: not vouched); raises
#: ``ProtocolError`` to skip that donor
StateCheck = Callable[[dict[str, torch.Tensor], dict[str, Any], bytes | None], None]


def download_state(
    node: PeerNode,
    timeout: float = 300.0,
    *,
    run_id: str | None = None,
    max_bytes: int = 8 << 30,
    ledger: ByteLedger | None = None,
    wait_for_donor: float = 30.0,
    min_round: int = 0,
    fresh_wait: float = 0.0,
    exclude: frozenset[str] = frozenset(),
    vouchers: int = 1,
    check: StateCheck | None = None,
    progress: ChunkProgress | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Download the freshest announced state of the run, in chunks from its donors
    (``peers.state.state_chunks``).

    Args:
        node: this (newcomer) peer's node.
        timeout: seconds for the whole download, donor search included.
        run_id: default: the node's run ID.
        max_bytes: refuse states larger than this.
        ledger: default: ``node.ledger`` (kind ``"state"``).
        wait_for_donor: seconds to keep looking when no donor has announced yet.
        min_round: prefer a state of this round or later: for up to ``fresh_wait`` seconds, older
            announcements are passed over (a peer that missed a round waits for the donors to announce
            the state that round committed, rather than adopting the one before it). After that the
            freshest state is taken, whatever its round (the round may have failed for everyone).
        fresh_wait: see ``min_round``.
        exclude: peers not to download from (e.g. the ones this peer has banned).
        vouchers: k: a state is taken only when ``min(k, donors)`` distinct donors vouch for its
            round and shared-parameter digest (see :func:`_vouched`); 1: any donor's state.
        check: called with each parsed state and the digest vouched for before it is taken; its
            ``ProtocolError`` skips that donor (the caller checks the state really has that digest).
        progress: the chunk bookkeeping (who served what), for callers that want to see it; verified
            chunks are kept in it from one donor to the next, never fetched twice.

    Returns:
        ``(tensors, meta)``; ``meta["round"]`` is the round number to adopt, ``meta["donor"]`` the
        peer ID that served it, ``meta["vouched_by"]`` how many distinct donors vouched for its round
        and digest (0: none did).

    Raises:
        PeerTimeoutError: no donor answered with a valid state in time.
    """
    run = run_id or node.run_id
    led = ledger if ledger is not None else node.ledger
    deadline = time.monotonic() + timeout
    donor_deadline = time.monotonic() + min(wait_for_donor, timeout)
    fresh_deadline = time.monotonic() + min(fresh_wait, timeout)
    errors: list[str] = []
    progress = progress if progress is not None else ChunkProgress()
    while True:
        manifests: dict[str, bytes] = {}
        chosen = _candidates(node, run, exclude, vouchers, errors, manifests)
        progress.dropped.clear()  # a new pass: a donor that broke off may be back
        if time.monotonic() < fresh_deadline:
            chosen = [c for c in chosen if c[0][0] >= min_round]
            if not chosen:
                time.sleep(0.2)
                continue
        for (rnd, peer, digest, nbytes), shared in chosen:
            if nbytes > max_bytes or peer not in manifests:
                errors.append(f"{peer[:12]}: {nbytes} bytes over the cap, or no manifest announced")
                continue
            # the donors of this round that vouch alike hold the same tensors: pull from them all
            sources = [(peer, digest, nbytes, manifests[peer])] + [
                (a[1], a[2], a[3], manifests[a[1]])
                for a, v in chosen
                if a[0] == rnd and v == shared and a[1] != peer and a[1] in manifests and a[3] <= max_bytes
            ][: MAX_DONORS - 1]
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerTimeoutError(f"state download timed out ({'; '.join(errors)[:300]})")
            try:
                tensors, meta = _take_from(node, rnd, sources, shared, run, led, left, check, progress)
            except SwarmError as e:
                errors.append(f"{peer[:12]}: {e}")
                logger.warning("state download from %s failed: %s", peer[:12], e)
                continue
            meta["vouched_by"] = _vouched_by(chosen, rnd, shared)  # counted here, never the donor's
            return tensors, meta
        if time.monotonic() >= donor_deadline:
            if not errors:
                raise NoStateAnnounced("no donor served a valid state (none announced)")
            raise PeerTimeoutError(f"no donor served a valid state ({'; '.join(errors)[:300]})")
        time.sleep(0.5)


def _vouched_by(
    chosen: list[tuple[tuple[int, str, bytes, int], bytes | None]], rnd: int, shared: bytes | None
) -> int:
    """How many distinct donors of ``chosen`` vouch for round ``rnd`` with digest ``shared`` (0: none)."""
    return len({a[1] for a, v in chosen if a[0] == rnd and v == shared}) if shared is not None else 0


def _take_from(
    node: PeerNode,
    rnd: int,
    sources: list[tuple[str, bytes, int, bytes]],
    shared: bytes | None,
    run: str,
    ledger: ByteLedger,
    timeout: float,
    check: StateCheck | None,
    progress: ChunkProgress,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Download the state ``sources[0]`` announced (from all ``sources``), parse it and let ``check``
    vet it.

    Raises:
        SwarmError: the donors failed, or served something else than announced.
    """
    peer, _, nbytes, _ = sources[0]
    coro = fetch_state(node, run, sources, ledger, progress, max_bytes=nbytes)
    data = node.loop.run(coro, timeout)
    tensors, meta = parse_state(data)
    if meta.get("round") != rnd:
        raise ProtocolError("state meta round differs from the announcement")
    if check is not None:
        check(tensors, meta, shared)
    logger.info("downloaded state of round %d (%d bytes) from %s", rnd, nbytes, peer[:12])
    meta["donor"] = peer  # whatever the donor wrote there: who served it (its manifest)
    return tensors, meta
