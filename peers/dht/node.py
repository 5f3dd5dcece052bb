"""The peer node: a hivemind DHT (Kademlia over libp2p) plus a TTL-heartbeat peer record.

A :class:`PeerNode` starts hivemind's ``DHT`` (which runs in a child process and drives the Go
``p2pd`` daemon), replicates its ``P2P`` handle into this process on a background event loop for our
own stream protocols, and publishes a :class:`peers.dht.records.PeerRecord` under ``"<run_id>.peers"``
with an expiration of ``heartbeat_ttl`` seconds, refreshed every third of it. ``shutdown()``
overwrites the record with a tombstone (so ``live_peers`` forgets the peer at once) and stops the DHT
and its daemon. Transport and discovery follow hivemind (Ryabinin et al., "Towards crowdsourced
training of large neural networks using decentralized mixture-of-experts", 2020).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from peers.dht.probe import serve_probes
from peers.dht.records import RUN_ID_PATTERN, PeerRecord, decode_record, encode_record, peers_key
from peers.dht.revocations import read_revocations
from peers.keys.signing import Signer
from peers.trust.admission import admission_from, own_token
from peers.trust.admitted import AdmittedPeers, token_fields
from peers.wire.ledger import ByteLedger
from peers.wire.memory import retain_freed_buffers
from peers.wire.transport import LoopThread
from swarmtrain.core.config import PeersConfig
from swarmtrain.core.errors import ConfigError, PeerTimeoutError, ProtocolError, SwarmError

__all__ = ["PeerNode", "validate_maddrs", "dht_time", "live_records", "RUN_ID_PATTERN"]

logger = logging.getLogger(__name__)
_DHT_CALL_TIMEOUT = 15.0
#: seconds shutdown gives the tombstone's store (a node whose DHT peers are gone must still stop)
_LEAVE_S = 3.0


_WATCHDOG_TASKS: list[asyncio.Task[None]] = []


def _exit_when_orphaned(
    recv: Callable[[], Any], parent: int, die: Callable[[], None], grace: float = 2.0
) -> Callable[[], Any]:
    """In the DHT process: ``recv`` of its command pipe from the peer process (``parent``), except
    that a pipe that breaks because that process died ends this one at once (``die``) instead of
    raising. hivemind logged the ``ConnectionResetError`` with its traceback, or let an ``EOFError``
    end the process with multiprocessing's traceback: one of them in the run's output for every
    killed peer, although nothing is wrong but the death the supervisor already reports. A broken
    pipe while the peer lives (still there after ``grace`` seconds) still raises."""

    def guarded() -> Any:
        try:
            return recv()
        except (OSError, EOFError):
            # the pipe breaks while the killed parent is still exiting (its sockets close before
            # this process is re-parented): give that a moment
            until = time.monotonic() + grace
            while os.getppid() == parent and time.monotonic() < until:
                time.sleep(0.05)
            if os.getppid() != parent:
                die()
            raise

    return guarded


async def _tie_to_parent(dht: Any, node: Any) -> None:
    """Runs inside hivemind's DHT process: when our main process dies, kill p2pd and exit.

    hivemind's DHT child and its p2pd otherwise outlive a SIGKILLed main process (docs/architecture.md,
    Known traps); a process-group kill handles supervised peers, this handles a peer started by hand.
    """
    parent = int(dht._parent_pid)
    # a forked DHT child inherits the app's stop-signal handlers (peers.dht.process.GracefulExit), which
    # turn a second signal into KeyboardInterrupt: hivemind's own hard stop (terminate) then printed
    # a traceback. Here SIGTERM just ends the process, and SIGINT is ignored: Ctrl-C in a terminal
    # reaches the whole process group, and a DHT process killed by it left the peer, which is still
    # finishing its step, with every DHT call timing out (warnings until it left). The peer stops
    # its DHT itself when it leaves, and the watchdog below covers a peer that died.
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the DHT process's main thread: keep what is there
        logger.debug("could not reset the DHT process's signal handlers")

    def die() -> None:  # p2pd first: it would outlive this process
        child = getattr(getattr(node, "p2p", None), "_child", None)
        if child is not None and child.returncode is None:
            child.kill()
        os._exit(0)

    pipe = getattr(dht, "_inner_pipe", None)
    if pipe is not None:
        pipe.recv = _exit_when_orphaned(pipe.recv, parent, die)

    async def _watch() -> None:
        while True:
            await asyncio.sleep(0.5)
            if os.getppid() != parent:
                die()

    _WATCHDOG_TASKS.append(asyncio.create_task(_watch()))


def dht_time() -> float:
    """hivemind's DHT clock (seconds), the time base of every expiration."""
    from hivemind.utils import get_dht_time

    return float(get_dht_time())


def validate_maddrs(maddrs: list[str], what: str) -> list[str]:
    """Parse each multiaddr; raise ``ConfigError`` naming the first malformed one."""
    from hivemind.utils.multiaddr import Multiaddr

    out = []
    for m in maddrs:
        try:
            Multiaddr(m)
        except Exception as e:
            raise ConfigError(f"{what}: malformed multiaddr {m!r} ({type(e).__name__})") from None
        out.append(str(m))
    return out


class PeerNode:
    """A DHT peer with a published record; a context manager.

    Args:
        config: ``PeersConfig`` (run ID, initial peers, host/announce multiaddrs, identity file, region).
        role: the role announced in the record (``"trainer"``, ``"bootstrap"``, ``"monitor"``...).
        heartbeat_ttl: seconds a record stays valid without a refresh.
        startup_timeout: seconds allowed for the DHT and p2pd to start and bootstrap.
        client_mode: join the DHT as a client that stores nothing for others (``status`` uses it).
        publish_record: whether to announce this node at all (``False`` for a read-only monitor).

    Attributes:
        peer_id: base58 libp2p peer ID.
        visible_maddrs: multiaddrs others can pass as ``--initial-peers``.
        dht: the ``hivemind.DHT``.
        p2p: the ``hivemind.P2P`` replica in this process (for stream handlers).
        loop: the background event loop the P2P handle lives on.
        ledger: this node's byte ledger (collectives and state transfer count into it by default).

    Raises:
        ConfigError: bad run ID or multiaddrs, unusable identity file.
        SwarmError: the DHT or the p2p daemon did not start (e.g. no initial peer answered).
    """

    def __init__(
        self,
        config: PeersConfig,
        *,
        role: str = "trainer",
        heartbeat_ttl: float = 30.0,
        startup_timeout: float = 60.0,
        client_mode: bool = False,
        publish_record: bool = True,
    ) -> None:
        if not RUN_ID_PATTERN.match(config.run_id):
            raise ConfigError(f"run_id {config.run_id!r}: use 1-64 letters, digits, '_', '.', '-'")
        if heartbeat_ttl < 1.0:
            raise ConfigError("heartbeat_ttl must be >= 1 s")
        retain_freed_buffers()  # per-round multi-MiB buffers come from the heap (peers.wire.memory)
        self.config = config
        self.run_id = config.run_id
        self.role = role
        self.heartbeat_ttl = float(heartbeat_ttl)
        self.ledger = ByteLedger()
        initial = validate_maddrs(list(config.initial_peers), "initial_peers")
        kwargs = self._dht_options(config, startup_timeout, publish_record)
        #: who may send to this node's handlers (the collective's, the state server's)
        self.admitted = AdmittedPeers(
            self.admission,
            lambda: self.live_peers(timeout=5),
            revocations=lambda: read_revocations(self.dht, self.run_id),
        )
        self._closed = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self.loop = LoopThread(f"swarmtrain-p2p-{role}")
        self._start_dht(initial, client_mode, kwargs, startup_timeout)
        self._publish_record = publish_record
        self._start_record(config, publish_record)
        self.manifest_server = self._serve_manifest(config)
        logger.info("peer %s up, role %s, maddrs %s", self.peer_id, role, self.visible_maddrs)

    def _dht_options(
        self, config: PeersConfig, startup_timeout: float, publish_record: bool
    ) -> dict[str, Any]:
        """The ``hivemind.DHT`` keyword arguments: listen and announce addresses, the trust settings."""
        host = validate_maddrs(list(config.host_maddrs), "host_maddrs")
        announce = validate_maddrs(list(config.announce_maddrs), "announce_maddrs")
        kwargs: dict[str, Any] = {"host_maddrs": host, "startup_timeout": startup_timeout}
        if announce:
            kwargs["announce_maddrs"] = announce
        kwargs.update(self._trust(config, publish_record))
        return kwargs

    def _start_dht(
        self, initial: list[str], client_mode: bool, kwargs: dict[str, Any], timeout: float
    ) -> None:
        """Start the DHT and its p2p daemon (tied to this process), and the P2P replica on ``loop``.

        Raises:
            SwarmError: the DHT did not start (what was started is stopped again).
        """
        import hivemind

        try:
            self.dht = hivemind.DHT(
                initial_peers=initial or None, start=True, client_mode=client_mode, **kwargs
            )
        except Exception as e:
            self.loop.stop()
            raise SwarmError(f"the DHT did not start: {type(e).__name__}: {e}") from None
        try:
            self.dht.run_coroutine(_tie_to_parent)
            self.p2p = self.loop.run(self.dht.replicate_p2p(), timeout)
            self.peer_id = str(self.dht.peer_id.to_base58())
            self.visible_maddrs = [str(m) for m in self.dht.get_visible_maddrs()]
        except BaseException:
            self._stop_dht()
            raise

    def _start_record(self, config: PeersConfig, publish_record: bool) -> None:
        """This peer's record; when it is published, the heartbeat that renews it and the probe handler."""
        from swarmtrain.core import __version__

        role = self.role
        self._record = PeerRecord(
            peer_id=self.peer_id,
            run_id=self.run_id,
            role=role,
            version=__version__,
            region=config.region,
            maddrs=tuple(self.visible_maddrs),
            time=dht_time(),
            extra=dict(token_fields(self.token)),  # others check its expiry (peers.trust.admitted)
        )
        if publish_record:
            self._store_record(self._record, dht_time() + self.heartbeat_ttl)
            self._hb_thread = threading.Thread(
                target=self._heartbeat, name="swarmtrain-heartbeat", daemon=True
            )
            self._hb_thread.start()
            serve_probes(self)  # every listed peer answers `swarmtrain doctor`'s RTT/bandwidth probes

    def _serve_manifest(self, config: PeersConfig) -> Any:
        """Serve the run manifest named by ``config.manifest`` (``peers.dht.manifest_service``), if any.

        Raises:
            ConfigError: the file cannot be read, is not a valid manifest, or is another run's.
        """
        if not config.manifest:
            return None
        from peers.dht.manifest_service import ManifestServer
        from swarmtrain.core.errors import ProtocolError

        path = Path(config.manifest).expanduser()
        try:
            server = ManifestServer(self.p2p, self.loop, path.read_bytes())
        except OSError as e:
            self.shutdown()
            raise ConfigError(f"cannot read the run manifest {path}: {e.strerror}") from None
        except ProtocolError as e:
            self.shutdown()
            raise ConfigError(f"{path} is not a valid run manifest: {e}") from None
        if server.manifest.run_id != self.run_id:
            self.shutdown()
            raise ConfigError(f"{path} is run {server.manifest.run_id!r}'s manifest, not {self.run_id!r}'s")
        return server

    def _trust(self, config: PeersConfig, publish_record: bool) -> dict[str, Any]:
        """Set the identity (``signer``), the policy and this node's token; returns the DHT's identity
        and record-validator arguments. Every node has an identity file: its key signs the node's DHT
        records (``peers.dht.dht_records``); without one configured, a throwaway key.

        Raises:
            ConfigError: an unusable identity file, an incomplete policy, or (for a node that writes
                records; a read-only monitor only checks others') a policy that keeps this node out.
        """
        from peers.dht.dht_records import SignedRecords
        from peers.keys.identity import ensure_identity, throwaway_identity

        kw: dict[str, Any] = {}
        if config.identity_path:
            ensure_identity(config.identity_path)
            kw["identity_path"] = str(config.identity_path)
            kw["check_if_identity_free"] = config.identity_check
        else:
            kw["identity_path"] = throwaway_identity()
            kw["check_if_identity_free"] = False  # a fresh key is nobody else's
        self.signer = Signer(kw["identity_path"])
        self.admission = admission_from(config)
        self.token = own_token(config, self.admission, self.signer.peer_id, check=publish_record)
        kw["record_validators"] = [SignedRecords(self.signer, self.admission, self.token)]
        return kw

    # --- records ------------------------------------------------------------------------------------

    def _store_record(self, rec: PeerRecord, expiration: float, timeout: float = _DHT_CALL_TIMEOUT) -> bool:
        try:
            fut = self.dht.store(
                peers_key(self.run_id),
                encode_record(rec),
                expiration,
                subkey=self.peer_id,
                return_future=True,
            )
            return bool(fut.result(timeout))
        except Exception as e:  # the heartbeat must survive a flaky DHT
            why = str(e) or (
                f"no DHT peer answered within {timeout:.0f} s" if isinstance(e, TimeoutError) else ""
            )
            logger.warning("storing the peer record failed: %s: %s", type(e).__name__, why)
            return False

    def _heartbeat(self) -> None:
        interval = self.heartbeat_ttl / 3.0
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._lock:
                rec = replace(
                    self._record,
                    time=dht_time(),
                    bytes_sent=self.ledger.sent,
                    bytes_received=self.ledger.received,
                )
                self._record = rec
            self._store_record(rec, dht_time() + self.heartbeat_ttl)

    def publish(self, **fields: Any) -> None:
        """Update fields of this peer's record and re-publish it soon (non-blocking).

        Known fields: ``step, round, throughput, loss, role, region, contributed_tokens,
        committed_rounds``; any other keyword goes into ``extra`` (numbers or short strings).

        Raises:
            ConfigError: a value of the wrong type.
        """
        counts = ("step", "round", "contributed_tokens", "committed_rounds")
        known = {*counts, "throughput", "loss", "role", "region"}
        with self._lock:
            extra = dict(self._record.extra)
            upd: dict[str, Any] = {}
            for k, v in fields.items():
                if k in known:
                    upd[k] = v
                elif isinstance(v, int | float | str) and not isinstance(v, bool):
                    extra[k] = v
                else:
                    raise ConfigError(f"publish: field {k!r} must be a number or a string")
            for k in counts:
                if k in upd:
                    upd[k] = int(upd[k])
            for k in ("throughput", "loss"):
                if k in upd:
                    upd[k] = float(upd[k])
            self._record = replace(self._record, extra=extra, **upd)
        self._wake.set()

    @property
    def record(self) -> PeerRecord:
        """This peer's current record (as last published or about to be)."""
        with self._lock:
            return self._record

    def live_peers(self, run_id: str | None = None, timeout: float = _DHT_CALL_TIMEOUT) -> list[PeerRecord]:
        """Records of the live (unexpired, not deregistered) peers of ``run_id`` (default: ours).

        Malformed records are skipped with a warning. Sorted by peer ID.

        Raises:
            PeerTimeoutError: the DHT did not answer within ``timeout``.
        """
        run = run_id or self.run_id
        try:
            found = self.dht.get(peers_key(run), latest=True, return_future=True).result(timeout)
        except TimeoutError:
            raise PeerTimeoutError("the DHT did not answer the peer list query") from None
        if found is None or not isinstance(found.value, dict):
            return []
        records = live_records(found.value, run)
        if run == self.run_id:  # admitted writers' records (peers.dht.dht_records), their tokens checked
            self.admitted.note(records)
        return records

    # --- lifecycle ----------------------------------------------------------------------------------

    def _stop_dht(self) -> None:
        try:
            self.loop.run(self.p2p.shutdown(), 5.0) if hasattr(self, "p2p") else None
        except Exception:
            logger.debug("p2p replica shutdown failed", exc_info=True)
        try:
            self.dht.shutdown()
        except Exception:
            logger.debug("DHT shutdown failed", exc_info=True)
        self.loop.stop()

    def shutdown(self) -> None:
        """Deregister (tombstone record), stop the heartbeat, the DHT and its p2p daemon. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        self._wake.set()
        if self._hb_thread is not None:
            self._hb_thread.join(2.0)  # a daemon thread: one stuck in a store is left behind
        if self._publish_record:
            # A newer expiration wins in hivemind's DHT, so the tombstone outlives the last heartbeat.
            # Bounded: a node whose DHT peers are gone must still stop within seconds;
            # the record then expires with its TTL.
            tomb = replace(self._record, left=True, time=dht_time())
            self._store_record(tomb, dht_time() + self.heartbeat_ttl + 1.0, timeout=_LEAVE_S)
        self._stop_dht()
        logger.info("peer %s shut down", self.peer_id)

    @property
    def closed(self) -> bool:
        """True after ``shutdown()``."""
        return self._closed

    def __enter__(self) -> PeerNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def wait_for_peers(self, n: int, timeout: float, poll: float = 0.2) -> list[PeerRecord]:
        """Block until at least ``n`` live peers of this run are visible; return them.

        Raises:
            PeerTimeoutError: fewer than ``n`` after ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            peers = self.live_peers(timeout=max(1.0, deadline - time.monotonic()))
            if len(peers) >= n:
                return peers
            if time.monotonic() >= deadline:
                raise PeerTimeoutError(f"saw {len(peers)} of {n} peers within {timeout:.0f} s")
            time.sleep(poll)


def live_records(entries: dict[Any, Any], run_id: str) -> list[PeerRecord]:
    """The live peers of ``run_id`` among the DHT entries (subkey -> value with expiration) of its
    peer key: unexpired, well-formed, not deregistered, stored under their own peer ID. Malformed
    records are skipped with a warning. Sorted by peer ID."""
    now = dht_time()
    out: list[PeerRecord] = []
    for subkey, item in entries.items():
        if item.expiration_time < now:
            continue
        try:
            rec = decode_record(item.value)
        except ProtocolError as e:
            logger.warning("skipping a malformed peer record: %s", e)
            continue
        if rec.left or rec.peer_id != subkey or rec.run_id != run_id:
            continue
        out.append(rec)
    return sorted(out, key=lambda r: r.peer_id)
