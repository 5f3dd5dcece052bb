"""The processes of a local run: the bootstrap DHT node and one training peer, each reporting to the
parent through its queue (``swarmtrain.simulation.runner`` starts them, ``.supervisor`` reads them)."""

from __future__ import annotations

import logging
import queue as queue_mod
import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from swarmtrain.core.config import Config
from swarmtrain.core.errors import PeerTimeoutError
from swarmtrain.core.peer_error import report_error
from swarmtrain.simulation.logs import quiet_logs
from swarmtrain.simulation.results import PeerOutcome

if TYPE_CHECKING:
    from swarmtrain.app.peer.loop import PeerRun, PeerStatus

__all__ = ["ATTACKER_NICE", "attacker_priority", "bootstrap_main", "peer_main", "next_report"]

#: how much lower an attacking process runs than the honest peers on the run's one machine
ATTACKER_NICE = 10


def attacker_priority() -> None:
    """Run this process (an intruder or a colluder, and the p2p daemon it starts) at a lower CPU
    priority: on a real network an attacker's CPU is its own, so on one shared machine what it costs
    the honest peers is what its messages make them do, not the cores its own loop takes from them
    (without it, rounds the honest peers failed for want of CPU counted as the attack's effect)."""
    import os

    try:
        os.nice(ATTACKER_NICE)
    except OSError:  # not permitted here: run as is
        pass


def bootstrap_main(cfg_json: str, q: Any, log_level: int = logging.ERROR) -> None:
    """A DHT bootstrap node: reports its multiaddrs, then serves until its group is terminated."""
    from peers import GracefulExit, PeerNode

    quiet_logs(log_level)

    cfg = Config.model_validate_json(cfg_json)
    try:
        with GracefulExit() as stop, PeerNode(cfg.peers, role="bootstrap") as node:
            q.put(("bootstrap", -1, node.visible_maddrs))
            stop.wait(None)
    except BaseException as e:  # report, never hang the parent
        report_error(q, -1, "bootstrap", e)


def peer_main(
    rank: int,
    n_peers: int,
    cfg_json: str,
    q: Any,
    log_level: int = logging.ERROR,
    rejoin: bool = False,
    old_state_rules: bool = False,
) -> None:
    """One training peer: the app's peer loop with this rank's attack hooks; reports progress and a
    final ``PeerOutcome``. ``rejoin``: a restarted peer, which adopts the swarm's state before its
    first step and after a failed round, as a volunteer does. ``old_state_rules``: it takes states by
    the rules before commit certificates (vouching donors, witnessed rounds) and reduces senders'
    weights as claimed (no cap): the control of an intruder run, which must show that the colluders'
    forged state and inflated weight do act without them."""
    from swarmtrain.app.peer.loop import Membership, run_peer
    from swarmtrain.simulation.rss import RssWatch
    from swarmtrain.simulation.wiring import RankWiring

    quiet_logs(log_level)
    if old_state_rules:
        from peers.rounds import weights
        from peers.state import donors

        # the run's certificates are read as absent: the vouching rules alone apply, as before them
        donors.certified_states = lambda *args, **kwargs: None  # type: ignore[assignment]
        # and a sender's weight counts as claimed (no owners' cap)
        weights.bound_weights = lambda weights: weights

    try:
        cfg = Config.model_validate_json(cfg_json)
        wiring = RankWiring(cfg, rank, n_peers)
        rss = RssWatch()

        def status(s: PeerStatus) -> None:
            rss.start()  # from the first step: the model, data and optimizer are in memory
            q.put(("step", rank, asdict(s)))

        def finished(run: PeerRun) -> None:
            # reported before the peer lingers: it stays reachable until the parent has every
            # outcome, since a peer that leaves early would make a slower peer's last round fail
            if run.stopped_by_signal:
                q.put(("error", rank, f"peer {rank}: stopped by a signal before its last step"))
            else:
                outcome = replace(peer_outcome(rank, run, wiring.stats()), rss_growth_mib=rss.stop())
                q.put(("done", rank, asdict(outcome)))

        hooks = replace(wiring.hooks(), on_status=status, on_finished=finished)
        membership = Membership.fixed(rank, n_peers, cfg.peers)
        if rejoin:
            membership = replace(membership, catch_up_on_join=True, catch_up_after_failure=True)
        run_peer(cfg, membership, hooks)
    except BaseException as e:
        report_error(q, rank, f"peer {rank}", e)


def peer_outcome(rank: int, run: PeerRun, attack_stats: dict[str, int]) -> PeerOutcome:
    """A ``PeerOutcome`` from the peer loop's ``PeerRun``. A late round counts as failed here too,
    and ``late_rounds`` only those after which the peer adopted the committed state, as the figures
    of earlier runs were counted."""
    return PeerOutcome(
        rank=rank,
        peer_id=run.peer_id,
        steps=run.steps,
        tokens=run.tokens,
        final_train_loss=run.final_train_loss,
        final_val_loss=run.final_val_loss,
        final_digest=run.final_digest,
        sync_digests=run.sync_digests,
        committed_rounds=run.committed_rounds,
        failed_rounds=run.failed_rounds + run.late_rounds,
        peak_sync_bytes_sent=run.peak_sync_bytes_sent,
        comm_wait_s=run.comm_wait_s,
        bytes_sent=run.bytes_sent,
        bytes_received=run.bytes_received,
        ledger=run.ledger,
        wall_s=run.wall_s,
        banned=run.banned,
        weights_over_cap=run.weights_over_cap,
        late_rounds=run.late_caught_up,
        attack_stats=attack_stats,
        donors=[str(d.get("donor", "")) for d in run.downloads],
        fragment_rounds={
            int(f): {"committed": c.get("committed", 0), "failed": c.get("failed", 0) + c.get("late", 0)}
            for f, c in run.fragment_rounds.items()
        },
        device=run.device,
    )


def next_report(q: Any, deadline: float) -> tuple[str, int, Any]:
    """The next report of the run's shared queue (``("tick", -1, None)`` after a second of silence).

    Raises:
        PeerTimeoutError: ``deadline`` (``time.monotonic()``) passed.
    """
    left = deadline - time.monotonic()
    if left <= 0:
        raise PeerTimeoutError("the simulation did not finish in time")
    try:
        msg: tuple[str, int, Any] = q.get(timeout=min(left, 1.0))
        return msg
    except queue_mod.Empty:
        return ("tick", -1, None)
