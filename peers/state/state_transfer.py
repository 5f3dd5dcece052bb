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

import torch

from peers.dht.node import PeerNode, dht_time
from peers.state.certificates import (
    MAX_CERTIFICATES,
    commit_key,
    encode_record,
    own_entries,
    sign_certificate,
)
from peers.state.donors import (
    MAX_VOUCHES,
    Announcement,
    candidates,
    decode_announcement,
    encode_announcement,
    freshest_vouched,
    parse_announcement,
    state_key,
    vouched_by,
)
from peers.state.state_chunks import (
    CHUNK_BYTES,
    MAX_DONORS,
    ChunkProgress,
    ChunkServer,
    ChunksLeft,
    fetch_state,
)
from peers.wire.ledger import ByteLedger
from swarmtrain.core.errors import ConfigError, PeerTimeoutError, ProtocolError, SwarmError

__all__ = [
    "StateServer",
    "download_state",
    "freshest_vouched",
    "decode_announcement",
    "parse_announcement",
    "NoStateAnnounced",
    "StateProvider",
    "state_key",
    "META_KEY",
]

logger = logging.getLogger(__name__)
StateProvider = Callable[[], tuple[Mapping[str, torch.Tensor], Mapping[str, Any]]]
META_KEY = "swarmtrain"
#: seconds a member's commit certificates outlive their last store: a state stays certified a while
#: after some of the members that signed it left (the established peers count only live ones)
CERTIFICATE_TTL = 600.0
#: seconds before an announcement that failed (a loaded DHT) is tried again, instead of a third of
#: its TTL: until then newcomers see an older certified state and adopt that one
RETRY_ANNOUNCE_S = 2.0
#: passes a download makes again when a donor's streams broke off (a loaded machine) rather than
#: serving a bad state: its verified chunks are kept for the next pass. While passes are left, a
#: donor that sent its manifest but not all its chunks ends the pass instead of the pass falling
#: back to an older round's donor (a newcomer on a loaded machine took a stale state that way)
BROKEN_RETRIES = 3


class NoStateAnnounced(PeerTimeoutError):
    """Nobody announced a state to download: the run has none yet (its first peer starts it)."""


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
        #: its signed commit certificates (``peers.state.certificates``), the last few
        self._certificates: list[list[bytes]] = []
        self._seeded = False  # whether the identity's earlier certificates were read (a restart)
        self.leaving = False  # announced too: a peer about to leave is nobody's holder of the state
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._failed = threading.Event()  # the last announcement failed: retried soon
        self.chunks = ChunkServer(
            node, self.run_id, self.ledger, keep=self.keep, upload_rate=upload_rate, chunk_bytes=chunk_bytes
        )
        self._thread = threading.Thread(
            target=self._reannounce, name="swarmtrain-state-announce", daemon=True
        )
        self._thread.start()

    def refresh(self, vouch: str | None = None, committed_by: int | None = None) -> str:
        """Snapshot the provider's state now (call it from the training thread between steps) and
        announce it. Returns the SHA-256 hex digest.

        ``vouch``: the hex SHA-256 of the parameters every peer must agree on, when this state is one
        this peer committed itself, or one it downloaded that at least two donors (and at least
        ``vouchers``) vouched for alike: the announcement then vouches for ``(round, vouch)``, and a
        newcomer takes a state only when enough donors vouch for it (:func:`download_state`'s
        ``vouchers``). A state one donor alone vouched for is never vouched for again.

        ``committed_by``: this peer committed the state's round itself in a group of that many
        members: it also signs a commit certificate of ``(round, vouch, committed_by)`` and stores its
        last few under ``"<run>.commit"`` (``peers.state.certificates``)."""
        tensors, meta = self.provider()
        rnd = meta.get("round")
        if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
            raise ConfigError("state meta needs an integer 'round' >= 0")
        data = serialize_state(tensors, meta)
        digest = hashlib.sha256(data).digest()
        manifest = self.chunks.put(digest, data)
        earlier = self._earlier_certificates(rnd) if committed_by is not None and vouch is not None else []
        with self._lock:
            self._latest = (digest, len(data), rnd, manifest)
            if vouch is not None:
                self._vouches = [*self._vouches, (rnd, bytes.fromhex(vouch))][-MAX_VOUCHES:]
                if committed_by is not None:
                    cert = sign_certificate(
                        self.node.signer, self.run_id, rnd, bytes.fromhex(vouch), committed_by
                    )
                    self._certificates = [*earlier, *self._certificates, cert][-MAX_CERTIFICATES:]
        self._announce()
        return digest.hex()

    def _earlier_certificates(self, rnd: int) -> list[list[bytes]]:
        """Before this process's first certificate: those its identity stored before, of rounds
        before ``rnd`` (``peers.state.certificates.own_entries``); then nothing."""
        if self._seeded:
            return []
        self._seeded = True
        return [e for r, e in own_entries(self.node, self.run_id, 3.0) if r < rnd]

    @property
    def announced_round(self) -> int | None:
        """The round of the state this peer announces (``None``: none yet)."""
        with self._lock:
            return None if self._latest is None else self._latest[2]

    def announce_leaving(self) -> None:
        """Say in the announcement that this peer is about to leave (it still serves its state)."""
        self.leaving = True
        self._announce()

    def _announce(self) -> bool:
        """Store the certificates, then the announcement; whether both were stored (nothing to
        announce counts as done). A failure is tried again soon (``_reannounce``)."""
        ok = self._store_announcement()
        if ok:
            self._failed.clear()
        else:
            self._failed.set()
        return ok

    def _store_announcement(self) -> bool:
        with self._lock:
            latest = self._latest
            if latest is None:
                return True
            vouches = list(self._vouches)
            certs = list(self._certificates)
        digest, nbytes, rnd, manifest = latest
        value = encode_announcement(
            digest, nbytes, rnd, vouches, manifest, leaving=self.leaving, certifies=bool(certs)
        )
        try:
            # the certificates first: a newcomer that reads this announcement finds this peer's
            # certificate of its round too, rather than a certified older round to fall back to
            if certs and not self.node.dht.store(
                commit_key(self.run_id),
                encode_record(self.node.signer, certs),
                dht_time() + max(self.announce_ttl, CERTIFICATE_TTL),
                subkey=self.node.peer_id,
                return_future=True,
            ).result(15.0):
                self._warn_once("storing the commit certificates failed: tried again every %.0f s")
                return False
            self.node.dht.store(
                state_key(self.run_id),
                value,
                dht_time() + self.announce_ttl,
                subkey=self.node.peer_id,
                return_future=True,
            ).result(15.0)
            return True
        except Exception as e:
            self._warn_once("announcing the state failed (%s): tried again every %.0f s", e)
            return False

    def _warn_once(self, message: str, *args: object) -> None:
        """A failure's warning the first time in a row; its retries at debug level."""
        (logger.debug if self._failed.is_set() else logger.warning)(message, *args, RETRY_ANNOUNCE_S)

    def _reannounce(self) -> None:
        """Announce again every third of the TTL, and :data:`RETRY_ANNOUNCE_S` after a failed one
        (its own or ``refresh``'s)."""
        last = time.monotonic()
        while not self._stop.wait(RETRY_ANNOUNCE_S):
            if self._failed.is_set() or time.monotonic() - last >= self.announce_ttl / 3.0:
                last = time.monotonic()
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
        wait_for_donor: seconds to keep looking when no donor has announced yet, or none served.
            A pass whose donor's streams broke off (not a bad state) is made again, up to
            :data:`BROKEN_RETRIES` times within ``timeout``, before an older round is taken.
        min_round: prefer a state of this round or later: for up to ``fresh_wait`` seconds, older
            announcements are passed over (a peer that missed a round waits for the donors to announce
            the state that round committed, rather than adopting the one before it). After that the
            freshest state is taken, whatever its round (the round may have failed for everyone).
        fresh_wait: see ``min_round``.
        exclude: peers not to download from (e.g. the ones this peer has banned).
        vouchers: k: a state is taken only when ``min(k, donors)`` distinct donors vouch for its
            round and shared-parameter digest (``peers.state.donors.vouched``); 1: any donor's state.
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
    led = ledger if ledger is not None else node.ledger
    pull = StatePull(node, run_id or node.run_id, led, max_bytes, check, progress)
    return pull.run(timeout, wait_for_donor, min_round, fresh_wait, exclude, vouchers)


class StatePull:
    """One download of a state (:func:`download_state`): passes over the donors' announcements until
    one donor's state, pulled in chunks from it and the donors that vouch alike, parses and passes
    ``check``; what failed is gathered for the error."""

    def __init__(
        self,
        node: PeerNode,
        run: str,
        ledger: ByteLedger,
        max_bytes: int,
        check: StateCheck | None,
        progress: ChunkProgress | None,
    ) -> None:
        self.node, self.run_id, self.ledger = node, run, ledger
        self.max_bytes, self.check = max_bytes, check
        self.progress = progress if progress is not None else ChunkProgress()
        self.errors: list[str] = []
        self.broke_off = False  # the last pass had a donor whose streams broke (not a bad state)

    def run(
        self,
        timeout: float,
        wait_for_donor: float,
        min_round: int,
        fresh_wait: float,
        exclude: frozenset[str],
        k: int,
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Pass over the candidates until a state is taken (``download_state``'s arguments)."""
        deadline = time.monotonic() + timeout
        donor_deadline = time.monotonic() + min(wait_for_donor, timeout)
        fresh_deadline = time.monotonic() + min(fresh_wait, timeout)
        retries = BROKEN_RETRIES
        while True:
            manifests: dict[str, bytes] = {}
            chosen = candidates(self.node, self.run_id, exclude, k, self.errors, manifests)
            self.progress.dropped.clear()  # a new pass: a donor that broke off may be back
            if time.monotonic() < fresh_deadline:
                chosen = [c for c in chosen if c[0][0] >= min_round]
                if not chosen:
                    time.sleep(0.2)
                    continue
            got = self._take_first(chosen, manifests, deadline, retry_breaks=retries > 0)
            if got is not None:
                return got
            if self.broke_off and retries > 0 and time.monotonic() < deadline:
                retries -= 1  # a stream that broke off on a loaded machine: its donor may serve next time
                time.sleep(0.5)
                continue
            if time.monotonic() >= donor_deadline:
                if not self.errors:
                    raise NoStateAnnounced("no donor served a valid state (none announced)")
                raise PeerTimeoutError(f"no donor served a valid state ({'; '.join(self.errors)[:300]})")
            time.sleep(0.5)

    def _take_first(
        self,
        chosen: list[tuple[Announcement, bytes | None]],
        manifests: dict[str, bytes],
        deadline: float,
        *,
        retry_breaks: bool,
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
        """The first of ``chosen`` (best first) whose state is served and passes; ``None``: none.
        With ``retry_breaks``, a donor that answered but whose chunk streams broke off
        (:class:`ChunksLeft`) ends the pass: the caller tries it again rather than this pass taking
        the next, older, round. A donor that cannot be reached at all is passed over at once."""
        self.broke_off = False
        for (rnd, peer, digest, nbytes), shared in chosen:
            if nbytes > self.max_bytes or peer not in manifests:
                self.errors.append(f"{peer[:12]}: {nbytes} bytes over the cap, or no manifest announced")
                continue
            # the donors of this round that vouch alike hold the same tensors: pull from them all
            sources = [(peer, digest, nbytes, manifests[peer])] + [
                (a[1], a[2], a[3], manifests[a[1]])
                for a, v in chosen
                if a[0] == rnd
                and v == shared
                and a[1] != peer
                and a[1] in manifests
                and a[3] <= self.max_bytes
            ][: MAX_DONORS - 1]
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerTimeoutError(f"state download timed out ({'; '.join(self.errors)[:300]})")
            try:
                tensors, meta = self._take_from(rnd, sources, shared, left)
            except SwarmError as e:
                self.errors.append(f"{peer[:12]}: {e}")
                logger.warning("state download from %s failed: %s", peer[:12], e)
                self.broke_off |= not isinstance(e, ProtocolError)
                if retry_breaks and isinstance(e, ChunksLeft):
                    return None
                continue
            meta["vouched_by"] = vouched_by(chosen, rnd, shared)  # counted here, never the donor's
            return tensors, meta
        return None

    def _take_from(
        self, rnd: int, sources: list[tuple[str, bytes, int, bytes]], shared: bytes | None, timeout: float
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Download the state ``sources[0]`` announced (from all ``sources``), parse it and let
        ``check`` vet it.

        Raises:
            SwarmError: the donors failed, or served something else than announced.
        """
        peer, _, nbytes, _ = sources[0]
        coro = fetch_state(self.node, self.run_id, sources, self.ledger, self.progress, max_bytes=nbytes)
        data = self.node.loop.run(coro, timeout)
        tensors, meta = parse_state(data)
        if meta.get("round") != rnd:
            raise ProtocolError("state meta round differs from the announcement")
        if self.check is not None:
            self.check(tensors, meta, shared)
        logger.info("downloaded state of round %d (%d bytes) from %s", rnd, nbytes, peer[:12])
        meta["donor"] = peer  # whatever the donor wrote there: who served it (its manifest)
        return tensors, meta
