"""``ByzantineGuard``: one peer's owner checks, suspicion records and bans.

A round calls the guard at four points: before forming the group (``refresh``: read the run's signed
suspicion records, recompute the bans, hand them to the matchmaker), once every aggregate is in
(``observe``: outlier flags), when an owner check fails (``owner_failed``), and when the round is over
(``publish``: re-sign and store this peer's table). The logic lives in ``peers.trust.verify`` (the
check's rules), ``peers.rounds.owner_check`` (its steps in the reduce) and ``peers.trust.suspicion``
(records and the ban rule). A Byzantine owner is simulated with a reducer wrapper
(``swarmtrain.simulation``), never here.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from peers.keys.signing import Signer
from peers.trust.suspicion import AccusationTable, compute_bans, decode_signed, encode_signed, suspicion_key
from swarmtrain.core.errors import ProtocolError

__all__ = ["ByzantineGuard", "read_tables", "build_guard"]

logger = logging.getLogger(__name__)
_RECORD_TTL = 3600.0


class ByzantineGuard:
    """Owner check on/off, accusation table, ban view of one peer.

    Args:
        node: the started ``PeerNode`` (its DHT stores the records; its identity key signs them).
        f: Byzantine peers tolerated (the ban rule needs ``f + 1`` accusers).
        owner_check: run the replicated-owner check in every all-reduce.
        strikes: outlier rounds an accuser must see before it counts.
        min_ratio: fraction of observed rounds that must be outliers.

    Raises:
        ConfigError: bad thresholds.
    """

    def __init__(
        self,
        node: Any,
        *,
        f: int = 0,
        owner_check: bool = True,
        strikes: int = 3,
        min_ratio: float = 0.5,
    ) -> None:
        self.signer: Signer = node.signer
        compute_bans({}, f, strikes=strikes, min_ratio=min_ratio)  # validates the thresholds
        self.node = node
        self.f = f
        self.owner_check = owner_check
        self.strikes = strikes
        self.min_ratio = min_ratio
        self.table = AccusationTable()
        self.bans: dict[str, str] = {}
        self._lock = threading.Lock()

    @property
    def peer_id(self) -> str:
        """This peer's ID."""
        return str(self.node.peer_id)

    def read_tables(self, timeout: float = 10.0) -> dict[str, AccusationTable]:
        """Every verified record of the run (this peer's own local table always included), but those of
        accusers this node no longer admits (a token expired or revoked)."""
        out = read_tables(self.node.dht, self.node.run_id, timeout)
        admitted = getattr(self.node, "admitted", None)
        if admitted is not None:
            gone = admitted.refused()
            out = {k: v for k, v in out.items() if k not in gone}
        with self._lock:
            out[self.peer_id] = AccusationTable.from_obj(self.table.to_obj())
        return out

    def refresh(self, timeout: float = 10.0) -> dict[str, str]:
        """Recompute the bans from the records; returns peer -> reason (also kept in ``bans``)."""
        bans = compute_bans(self.read_tables(timeout), self.f, strikes=self.strikes, min_ratio=self.min_ratio)
        new = set(bans) - set(self.bans)
        for p in sorted(new):
            logger.warning("banning %s: %s", p[:16], bans[p])
        self.bans = bans
        return bans

    def observe(self, seen: set[str], flagged: set[str]) -> None:
        """One round's outlier evidence: ``seen`` senders whose rows this peer reduced, ``flagged`` ones."""
        with self._lock:
            for p in sorted(seen):
                if p != self.peer_id:
                    self.table.observe(p, p in flagged)

    def owner_failed(self, round_id: int, pairs: list[tuple[str, str]]) -> None:
        """Record failed owner checks ``(primary, verifier)`` of ``round_id``."""
        with self._lock:
            for primary, verifier in pairs:
                self.table.add_owner_failure(round_id, primary, verifier)

    def publish(self) -> None:
        """Sign and store this peer's table (non-blocking; a failed store is retried next round)."""
        from peers.dht.node import dht_time

        with self._lock:
            value = encode_signed(self.node.run_id, self.table, self.signer)
        try:
            self.node.dht.store(
                suspicion_key(self.node.run_id),
                value,
                dht_time() + _RECORD_TTL,
                subkey=self.peer_id,
                return_future=True,
            )
        except Exception as e:
            logger.info("storing the suspicion record failed: %s", e)


def read_tables(dht: Any, run_id: str, timeout: float = 10.0) -> dict[str, AccusationTable]:
    """The run's accusation tables whose signatures verify (accuser -> table); bad records are skipped."""
    from peers.dht.node import dht_time

    out: dict[str, AccusationTable] = {}
    try:
        found = dht.get(suspicion_key(run_id), latest=True, return_future=True).result(timeout)
    except Exception as e:
        logger.info("reading suspicion records failed: %s", e)
        return out
    if found is None or not isinstance(found.value, dict):
        return out
    now = dht_time()
    for subkey, item in found.value.items():
        if not isinstance(subkey, str) or item.expiration_time < now:
            continue
        try:
            out[subkey] = decode_signed(run_id, subkey, item.value)
        except ProtocolError as e:
            logger.warning("ignoring a suspicion record under %s: %s", str(subkey)[:16], e)
    return out


def build_guard(node: Any, peers_cfg: Any) -> ByzantineGuard:
    """The guard a peer runs from its ``PeersConfig`` (``owner_check``, ``byzantine_f``,
    ``ban_strikes``)."""
    return ByzantineGuard(
        node,
        f=peers_cfg.byzantine_f,
        owner_check=peers_cfg.owner_check,
        strikes=peers_cfg.ban_strikes,
    )
