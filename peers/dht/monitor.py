"""A read-only view of a run's DHT records, for ``swarmtrain status`` and the dashboard.

A :class:`PeerNode` runs hivemind's DHT in a child process and replicates its p2p daemon into this
one: right for a peer that trains for hours, slow for a command that reads a few records and exits
(the child starts, imports and bootstraps under whatever load the machine has). :class:`RunReader`
instead starts one p2p daemon and a client-mode ``DHTNode`` on an event loop thread of this process,
with the same record validator as every peer (signatures checked, non-admitted writers ignored). It
writes nothing, announces nothing and serves nothing.

It offers the one read call of ``hivemind.DHT`` that the record readers use (``get(key, latest=True,
return_future=True)``), so ``peers.rounds.guard.read_tables`` and :func:`peers.dht.node.live_records` work on
it unchanged.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import Any

from peers.dht.node import live_records, validate_maddrs
from peers.dht.records import PeerRecord, peers_key
from peers.keys.signing import Signer
from peers.trust.admission import admission_from
from peers.wire.transport import LoopThread
from swarmtrain.core.config import PeersConfig
from swarmtrain.core.errors import ConfigError, PeerTimeoutError, SwarmError

__all__ = ["RunReader"]

logger = logging.getLogger(__name__)


class RunReader:
    """Read a run's records through its DHT, from this process.

    Args:
        config: the run's ``[peers]`` (run ID, initial peers, admission policy).
        startup_timeout: seconds for the p2p daemon to start and the DHT to reach an initial peer.

    Raises:
        ConfigError: bad multiaddrs or an incomplete admission policy.
        SwarmError: no initial peer answered, or the p2p daemon did not start.
    """

    def __init__(self, config: PeersConfig, startup_timeout: float = 30.0) -> None:
        from hivemind.dht.node import DHTNode
        from hivemind.dht.validation import CompositeValidator
        from hivemind.p2p import P2P

        from peers.dht.dht_records import SignedRecords
        from peers.keys.identity import throwaway_identity

        initial = validate_maddrs(list(config.initial_peers), "initial_peers")
        if not initial:
            raise ConfigError("give --initial-peers: the address of any peer of the run")
        self.run_id = config.run_id
        identity = throwaway_identity()
        validator = SignedRecords(Signer(identity), admission_from(config))
        self.loop = LoopThread("swarmtrain-reader")
        self._p2p: Any = None
        self._node: Any = None

        async def start() -> None:
            self._p2p = await P2P.create(
                initial_peers=initial,
                host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                identity_path=identity,
                check_if_identity_free=False,  # a fresh key is nobody else's
            )
            self._node = await DHTNode.create(
                p2p=self._p2p,
                initial_peers=initial,
                client_mode=True,
                record_validator=CompositeValidator([validator]),
            )

        try:
            self.loop.run(start(), startup_timeout)
        except PeerTimeoutError:
            self.close()
            raise SwarmError(f"no initial peer answered within {startup_timeout:.0f} s") from None
        except Exception as e:
            self.close()
            raise SwarmError(f"could not reach the run's DHT: {type(e).__name__}: {e}") from None

    def get(
        self, key: str, latest: bool = True, return_future: bool = True
    ) -> concurrent.futures.Future[Any]:
        """``hivemind.DHT.get``'s read, as a future (the record readers' interface)."""
        return self.loop.submit(self._node.get(key, latest=latest))

    def live_peers(self, timeout: float = 10.0) -> list[PeerRecord]:
        """The run's live peers (see :func:`peers.dht.node.live_records`), sorted by peer ID.

        Raises:
            PeerTimeoutError: the DHT did not answer within ``timeout``.
        """
        try:
            found = self.get(peers_key(self.run_id)).result(timeout)
        except concurrent.futures.TimeoutError:
            raise PeerTimeoutError("the DHT did not answer the peer list query") from None
        if found is None or not isinstance(found.value, dict):
            return []
        return live_records(found.value, self.run_id)

    def close(self) -> None:
        """Stop the DHT node and the p2p daemon (safe to call twice)."""

        async def stop() -> None:
            if self._node is not None:
                await self._node.shutdown()
            if self._p2p is not None:
                await self._p2p.shutdown()

        try:
            self.loop.run(stop(), 5.0)
        except Exception:
            logger.debug("reader shutdown failed", exc_info=True)
        self._node = self._p2p = None
        self.loop.stop()

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
