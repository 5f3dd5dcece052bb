"""Replicas of one SWARM stage average their parameters through the run's collective.

Every server of a stage trains its own copy of the stage on the micro-batches routed to it; every
``period`` seconds of DHT time the servers of the stage meet in one round of
:class:`peers.collective.P2PCollective` (each stage is its own group: the rounds namespace is
``<run>.stage<k>``) and replace their parameters by the mean (any codec: every member decodes the same
aggregate bytes, so a committed round leaves them bit-identical). Optimizer states stay local.

Rounds are numbered by the period's index of DHT time, so servers that check at different moments of
the same period meet in the same round without agreeing on a counter first; a server that misses
one (busy with a long request, or late) fails that round and meets the others at the next.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from peers.collective import P2PCollective
from peers.node import PeerNode, dht_time
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.protocols import Compressor, RoundResult

__all__ = ["ReplicaSync", "FINAL_ROUND"]

logger = logging.getLogger(__name__)

#: round number of the last sync, when every server of the stage leaves at the end of a run
FINAL_ROUND = 1 << 40


class ReplicaSync:
    """Periodic parameter averaging among the servers of one stage.

    Args:
        node: this server's started node.
        stage: the stage it serves.
        params: the stage's parameters (averaged in place).
        compressor: codec of the averaging round.
        period: seconds of DHT time between two syncs.
        timeout: seconds one sync round may take.
        join_window: seconds a round's leader waits for the stage's other servers.
    """

    def __init__(
        self,
        node: PeerNode,
        stage: int,
        params: Mapping[str, torch.Tensor],
        compressor: Compressor,
        *,
        period: float = 5.0,
        timeout: float = 20.0,
        join_window: float = 1.0,
    ) -> None:
        if not period > 0 or not timeout > 0:
            raise ConfigError("sync period and timeout must be > 0")
        self.stage = stage
        self.params = dict(params)
        self.compressor = compressor
        self.period = float(period)
        self.timeout = float(timeout)
        self.collective = P2PCollective(
            node, run_id=f"{node.run_id}.stage{stage}", min_peers=1, join_window=join_window
        )
        self._last = self._epoch()
        self.committed = 0
        self.failed = 0
        self.last_group = 0

    def _epoch(self) -> int:
        return int(dht_time() // self.period)

    def due(self) -> bool:
        """True when a new period began since the last sync."""
        return self._epoch() > self._last

    def maybe_sync(self) -> RoundResult | None:
        """Sync when a new period began (call it between requests); ``None`` when not due."""
        e = self._epoch()
        if e <= self._last:
            return None
        self._last = e
        return self.sync(e)

    @torch.no_grad()
    def sync(self, round_id: int) -> RoundResult:
        """Average the parameters with the stage's servers in round ``round_id`` (rounds only go up)."""
        if round_id < self.collective.round_id:
            raise ConfigError(f"sync round {round_id} is behind the collective's {self.collective.round_id}")
        self.collective.round_id = round_id
        tensors = {k: v.detach().clone() for k, v in self.params.items()}
        res = self.collective.all_reduce(
            tensors, compressor=self.compressor, timeout=self.timeout, kind="stage"
        )
        if res.committed:
            for k, v in res.tensors.items():
                self.params[k].copy_(v)
            self.committed += 1
            self.last_group = len(res.participants)
        else:
            self.failed += 1
            logger.info("stage %d sync round %d failed: %s", self.stage, round_id, res.reason)
        return res

    def close(self) -> None:
        """Stop taking rounds."""
        self.collective.close()
