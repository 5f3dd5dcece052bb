"""``AdmittedPeers``: which peers this node knows to be admitted, and until when.

The policy decides ``open`` and ``allowlist`` at once. Under ``token`` a peer is admitted by this
node's own check of the join token its peer record carries (``token_fields``: the token's expiry and
signature; the run and peer ID are the record's own): admitted until the token's expiry, then
re-checked (a fresh read of the records; a renewed token admits again, an expired one is refused).
A record without token fields (a writer the DHT admitted when it stored it) admits its writer for
:data:`UNVERIFIED_S` seconds only. Revocations signed by the run key (``peers.trust.revocation``) are
read at most every ``REVOCATION_READ_S`` seconds and refuse their peer at once. A leader's group list
admits nobody: each member is checked here (``peers.rounds.collective``).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgpack

from peers.trust.admission import Admission, NotAdmitted
from peers.trust.revocation import REVOCATION_READ_S, decode_revocation
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.safe_msgpack import unpack

__all__ = ["AdmittedPeers", "token_fields", "token_of_record", "UNVERIFIED_S"]

logger = logging.getLogger(__name__)
#: seconds a record without token fields admits its writer before the next read must show it again
UNVERIFIED_S = 30.0


def token_fields(token: bytes | None) -> dict[str, float | str]:
    """What a peer record carries of its writer's join token (``extra``): its expiry and signature."""
    if not token:
        return {}
    try:
        body, sig = unpack(token, what="join token", max_bytes=512, max_bin=512, max_array=3)
        expires = unpack(body, what="join token body", max_bytes=512, max_array=3)[2]
        return {"token_expires": float(expires), "token_sig": base64.urlsafe_b64encode(sig).decode()}
    except (ProtocolError, ValueError, TypeError, IndexError):  # not a token: shows none (others refuse it)
        return {}


def token_of_record(run_id: str, peer_id: str, extra: Mapping[str, Any]) -> bytes | None:
    """The join token a record's ``extra`` shows for its writer (``None`` when it shows none)."""
    expires, sig = extra.get("token_expires"), extra.get("token_sig")
    if not isinstance(expires, float) or not isinstance(sig, str) or len(sig) > 128:
        return None
    try:
        raw = base64.urlsafe_b64decode(sig)
    except ValueError:
        return None
    body = bytes(msgpack.packb([run_id, peer_id, expires], use_bin_type=True))
    return bytes(msgpack.packb([body, raw], use_bin_type=True))


class AdmittedPeers:
    """Which peers this node knows to be admitted (see the module docstring).

    An unknown peer is decided by the first read of the records that *starts after it asked*: one
    read runs at a time, at most once per ``min_interval`` seconds, and every peer that asked before
    it started gets its answer from it. So a stranger's flood of streams costs one DHT read per
    interval, and an admitted peer whose first message arrives just after a read (before this node
    saw its record) waits for the next read instead of being refused.

    Args:
        admission: the run's policy.
        lookup: reads the run's peer records; returns them (``peer_id`` and ``extra``) or peer IDs.
        min_interval: seconds between the starts of two reads.
        revocations: reads the run's revocation records (signed blobs), or ``None``.
        clock: wall-clock time (Unix seconds) for expiries (tests inject one).
    """

    def __init__(
        self,
        admission: Admission,
        lookup: Callable[[], Iterable[Any]],
        min_interval: float = 1.0,
        revocations: Callable[[], Iterable[bytes]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.admission, self.lookup, self.min_interval = admission, lookup, min_interval
        self.revocations, self.clock = revocations, clock
        self._known: dict[str, float] = {}  # peer -> wall-clock time its admission ends
        self._refused: set[str] = set()  # a token seen expired or invalid
        self._revoked: dict[str, float] = {}  # peer -> until
        self._last_start = -float("inf")  # when the last read started
        self._answered = -float("inf")  # when the last finished read started
        self._reading = False
        self._rev_next, self._rev_reading = 0.0, False
        self._cond = threading.Condition()
        #: the check in flight for each undecided peer (:meth:`acheck`): its other streams wait on it
        self._pending: dict[str, tuple[float, asyncio.Future[bool]]] = {}

    def note(self, peers: Iterable[Any]) -> None:
        """Record the writers of validated peer records (records, or bare peer IDs)."""
        if self.admission.policy != "token":
            return
        now = self.clock()
        for rec in peers:
            peer = rec if isinstance(rec, str) else getattr(rec, "peer_id", None)
            if not isinstance(peer, str):
                continue
            extra = {} if isinstance(rec, str) else getattr(rec, "extra", {})
            token = (
                token_of_record(self.admission.run_id, peer, extra) if isinstance(extra, Mapping) else None
            )
            until = now + UNVERIFIED_S
            if token is not None:
                try:
                    self.admission.check(peer, token, now)
                except NotAdmitted:
                    with self._cond:
                        self._refused.add(peer)
                        self._known.pop(peer, None)
                    continue
                until = self.admission.token_expiry(token)
            with self._cond:
                if peer not in self._revoked:
                    self._known[peer] = max(until, self._known.get(peer, until))
                    self._refused.discard(peer)

    def decided(self, peer_id: str) -> bool | None:
        """Whether ``peer_id`` is admitted, without a DHT read; ``None`` when only a read can tell."""
        if self.admission.policy == "open":
            return True
        self._maybe_read_revocations()
        with self._cond:
            if peer_id in self._revoked:
                return False
        if self.admission.policy == "allowlist":
            return peer_id in self.admission.allowlist
        with self._cond:
            until = self._known.get(peer_id)
            if until is None:
                return None
            if until > self.clock():
                return True
            del self._known[peer_id]  # its admission ended: the next read decides (a renewed token)
            self._refused.add(peer_id)
            return None

    def refused(self) -> frozenset[str]:
        """The peers this node knows it does not admit (revoked, or a token seen expired): rounds
        leave them out."""
        if self.admission.policy == "open":
            return frozenset()
        self._maybe_read_revocations()
        now = self.clock()
        with self._cond:
            for peer, until in list(self._known.items()):
                if until <= now:
                    del self._known[peer]
                    self._refused.add(peer)
            return frozenset(self._refused | set(self._revoked))

    def read_revocations(self) -> None:
        """Read the run's revocation records once and honour those the run key signed."""
        if self.revocations is None or self.admission.run_public is None:
            return
        try:
            blobs = list(self.revocations())
        except Exception as e:  # a flaky DHT: the next read may succeed
            logger.info("reading the run's revocations failed: %s", e)
            blobs = []
        now = self.clock()
        for blob in blobs:
            try:
                rev = decode_revocation(blob, self.admission.run_public)
            except NotAdmitted as e:
                logger.debug("ignoring a revocation: %s", e)
                continue
            if rev.run_id != self.admission.run_id or rev.until < now:
                continue
            with self._cond:
                if rev.peer_id not in self._revoked:
                    logger.warning("peer %s: its admission was revoked by the run key", rev.peer_id[:16])
                self._revoked[rev.peer_id] = rev.until
                self._known.pop(rev.peer_id, None)

    def _maybe_read_revocations(self) -> None:
        """Start a background read of the revocations when the last one is older than the interval."""
        if self.revocations is None or self.admission.run_public is None:
            return
        with self._cond:
            if self._rev_reading or time.monotonic() < self._rev_next:
                return
            self._rev_reading, self._rev_next = True, time.monotonic() + REVOCATION_READ_S

        def read() -> None:
            try:
                self.read_revocations()
            finally:
                with self._cond:
                    self._rev_reading = False

        threading.Thread(target=read, name="swarmtrain-revocations", daemon=True).start()

    def check(self, peer_id: str, asked: float | None = None) -> bool:
        """Whether ``peer_id`` is admitted, reading the run's peer records if needed (blocking: up to
        ``min_interval`` plus one read).

        Args:
            asked: ``time.monotonic()`` when the question arose (default: now); a read that started
                after it answers it.
        """
        known = self.decided(peer_id)
        if known is not None:
            return known
        asked = time.monotonic() if asked is None else asked
        with self._cond:
            while True:
                if self._admits(peer_id):
                    return True
                if self._answered >= asked:  # a read that started after the question found nothing
                    return False
                wait = self._last_start + self.min_interval - time.monotonic()
                if self._reading or wait > 0:
                    self._cond.wait(wait if not self._reading else None)
                    continue
                self._reading, start = True, time.monotonic()
                self._last_start = start
                break
        try:
            found = list(self.lookup())
        except Exception as e:  # a flaky DHT: this read found nobody, the next may succeed
            logger.info("reading the run's peer records failed: %s", e)
            found = []
        self.note(found)
        with self._cond:
            self._reading, self._answered = False, start
            self._cond.notify_all()
            return self._admits(peer_id)

    def _forget(self, peer_id: str, done: asyncio.Future[bool]) -> None:
        if self._pending.get(peer_id, (0.0, None))[1] is done:
            del self._pending[peer_id]

    def _admits(self, peer_id: str) -> bool:
        """(under the lock) ``peer_id`` is known, unexpired and not revoked."""
        return peer_id not in self._revoked and self._known.get(peer_id, -1.0) > self.clock()

    async def acheck(self, peer_id: str) -> bool:
        """:meth:`check` for an event loop: a DHT read, if one is needed, runs in a worker thread (the
        question counts as asked now, not when a worker is free: a flood queued behind it shares one
        read)."""
        known = self.decided(peer_id)
        if known is not None:
            return known
        asked = time.monotonic()
        try:
            loop = asyncio.get_running_loop()
            while True:
                # one check (one worker thread) per undecided peer, whatever its number of streams:
                # a stranger's flood of streams cannot take the executor the node's other work uses
                since, pending = self._pending.get(peer_id, (0.0, None))
                if pending is None or pending.done() or pending.get_loop() is not loop:
                    since, pending = time.monotonic(), loop.run_in_executor(None, self.check, peer_id, asked)
                    self._pending[peer_id] = (since, pending)
                    pending.add_done_callback(lambda f: self._forget(peer_id, f))
                ok = await asyncio.shield(pending)
                if ok or since >= asked:  # a "no" from a check asked before this question: ask again
                    return ok
        except (RuntimeError, asyncio.CancelledError):
            # the node is shutting down (its executor closed, or the stream's handler task cancelled
            # while it waited for a read): refuse quietly, so the handler ends normally instead of
            # asyncio printing the cancelled handler's traceback
            return False
