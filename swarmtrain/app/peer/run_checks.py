"""Checks a volunteer makes against its run's live peer records before it trains: the run-wide
settings (``swarmtrain.app.peer.run_agreement``), the reducer's breakdown point, whether the run has
committed a round yet."""

from __future__ import annotations

import logging
from typing import Any

from swarmtrain.app.peer.run_agreement import check_agreement, run_settings
from swarmtrain.core.config import Config
from swarmtrain.core.errors import SwarmError

__all__ = ["check_settings", "check_breakdown_point", "run_started"]

logger = logging.getLogger(__name__)


def _live_peers(node: Any) -> list[Any] | None:
    """The run's live peer records for an up-front check, or None when the DHT did not answer
    (the check is then skipped: the rounds will say what is wrong)."""
    try:
        return list(node.live_peers(timeout=10.0))
    except SwarmError:
        return None


def check_settings(node: Any, cfg: Config) -> None:
    """Refuse to join (``ConfigError``, one line) when every live trainer of the run uses another
    strategy, sync period, codec or reducer than this peer (``swarmtrain.app.peer.run_agreement``)."""
    live = _live_peers(node)
    if live is not None:
        check_agreement(run_settings(cfg), live, node.peer_id)


def check_breakdown_point(node: Any, cfg: Config, round_needs: int) -> None:
    """Say at once, at normal verbosity, when the run has fewer trainers than a round of the
    configured reducer needs (``round_needs``): its rounds fail until more peers join (and the peer
    gives up after ``give_up_after`` seconds), which would otherwise show only as failed rounds."""
    live = _live_peers(node) if round_needs > 2 else None
    if live is None:
        return
    n = len({r.peer_id for r in live if r.role == "trainer"} | {node.peer_id})
    if n < round_needs:
        p = cfg.peers
        logger.warning(
            "reducer %r tolerating f=%d needs n >= %d peers per round; the run has %d trainer(s) "
            "with this one: rounds fail until more join",
            p.reducer,
            p.byzantine_f,
            round_needs,
            n,
        )


def run_started(node: Any) -> int:
    """The highest round of another live peer that has committed a round (0: nobody has, so there
    is no state to wait for: rounds that only failed leave everyone at the initial parameters)."""
    try:
        peers = node.live_peers()
    except SwarmError:
        return 0
    rounds = [
        p.round
        for p in peers
        if p.peer_id != node.peer_id
        and isinstance(committed := p.extra.get("committed"), int)
        and committed > 0
    ]
    return max(rounds, default=0)
