"""One volunteer peer of an open run: what ``swarmtrain join`` runs.

A volunteer runs the shared peer loop (``swarmtrain.app.peer.loop``) with open membership: it
downloads the run's current state from a live donor (model, strategy state with the outer optimizer,
step and round number; safetensors bytes checked against the hash the donor announced), trains with
the configured strategy, and serves its own state to later newcomers after every committed sync.
Rounds close ``peers.join_window`` seconds after their leader arrives, so nobody waits for a fixed
peer count. After a round that failed for other reasons than lateness it adopts the freshest state
announced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from swarmtrain.app.peer.loop import Membership, PeerHooks, PeerRun, PeerStatus, run_peer
from swarmtrain.core.config import Config

__all__ = ["VolunteerStatus", "VolunteerResult", "run_volunteer"]

#: the live status line of a volunteer
VolunteerStatus = PeerStatus


@dataclass
class VolunteerResult:
    """Summary of a volunteer's run (``swarmtrain join --json`` writes it)."""

    peer_id: str
    steps: int
    final_train_loss: float
    final_val_loss: float | None
    final_digest: str
    sync_digests: dict[int, str] = field(default_factory=dict)
    downloads: list[dict[str, Any]] = field(default_factory=list)
    committed_rounds: int = 0
    contributed_tokens: int = 0  # tokens of its own steps in rounds it committed
    late_rounds: int = 0
    failed_rounds: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    ledger: dict[str, Any] = field(default_factory=dict)
    stopped_by_signal: bool = False

    @classmethod
    def from_run(cls, run: PeerRun) -> VolunteerResult:
        return cls(
            peer_id=run.peer_id,
            steps=run.steps,
            final_train_loss=run.final_train_loss,
            final_val_loss=run.final_val_loss,
            final_digest=run.final_digest,
            sync_digests=run.sync_digests,
            downloads=run.downloads,
            committed_rounds=run.committed_rounds,
            contributed_tokens=run.contributed_tokens,
            late_rounds=run.late_rounds,
            failed_rounds=run.failed_rounds,
            bytes_sent=run.bytes_sent,
            bytes_received=run.bytes_received,
            ledger=run.ledger,
            stopped_by_signal=run.stopped_by_signal,
        )


def run_volunteer(
    cfg: Config,
    *,
    on_status: Callable[[VolunteerStatus], None] | None = None,
    on_grace_over: Callable[[VolunteerResult], None] | None = None,
    download_timeout: float = 120.0,
) -> VolunteerResult:
    """Join the run named by ``cfg.peers`` and train until ``cfg.train.steps`` or a stop signal.

    Args:
        cfg: the run's configuration (strategy and codec must match the run's).
        on_status: called every ``train.log_interval`` steps and after every sync.
        on_grace_over: called with the result so far when the preemption grace ends the process
            (this function does not return then).
        download_timeout: seconds for one state download.

    Raises:
        SwarmError: the node could not start, or a configuration problem.
    """
    last = None if on_grace_over is None else lambda r: on_grace_over(VolunteerResult.from_run(r))
    hooks = PeerHooks(on_status=on_status, on_grace_over=last)
    run = run_peer(cfg, Membership.open(cfg.peers, download_timeout), hooks)
    return VolunteerResult.from_run(run)
