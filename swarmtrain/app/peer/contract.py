"""What a caller gives the peer loop and gets back: how the peer takes part in its run
(``Membership``), the callables it adds (``PeerHooks``), the live status it hears (``PeerStatus``,
timed by ``SyncClock``) and the counts of what the peer did (``PeerRun``). See
:mod:`swarmtrain.app.peer.loop` for the loop itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from swarmtrain.core.config import PeersConfig

if TYPE_CHECKING:
    from swarmtrain.app.data import BatchSampler
    from swarmtrain.core.protocols import Collective, Reducer

__all__ = ["Membership", "PeerHooks", "PeerStatus", "PeerRun", "SyncClock", "STATUS_EVERY_S"]


@dataclass(frozen=True)
class Membership:
    """How a peer takes part in its run.

    Attributes:
        rank: this peer's rank among ``n_peers`` (its data shard), or ``None`` for open membership:
            the data stream is then seeded from the peer ID and rounds wait for no fixed count.
        n_peers: peers of a fixed-size run (``None``: open).
        catch_up_on_join: download the swarm's state before the first step (a volunteer joining a
            run in progress; when nobody answers, this peer starts the run).
        catch_up_after_failure: after a round that failed for other reasons than lateness, adopt the
            freshest state announced.
        catch_up_timeout: seconds for one state download.
        linger_s: seconds to stay reachable after the last step, so that a peer finishing its last
            round can still sync with this one.
        give_up_after: seconds of failed rounds, none committed, after which the peer stops with the
            streak's most common reason (``RoundsKeepFailing``); 0: never.
    """

    rank: int | None
    n_peers: int | None
    catch_up_on_join: bool
    catch_up_after_failure: bool
    catch_up_timeout: float
    linger_s: float
    give_up_after: float = 0.0

    @classmethod
    def fixed(cls, rank: int, n_peers: int, peers: PeersConfig) -> Membership:
        """Rank ``rank`` of ``n_peers`` started together (``simulate``): all present from the start,
        a late peer waits up to a round's timeout for the state the others committed; it lingers a
        round's timeout, until the parent has every peer's outcome; it never gives up (attackers'
        rounds fail by design, and simulate has its own timeout)."""
        return cls(rank, n_peers, False, False, 2 * peers.round_timeout, peers.round_timeout)

    @classmethod
    def open(cls, peers: PeersConfig, download_timeout: float) -> Membership:
        """A volunteer (``join``): downloads the state at start and after any failed round."""
        return cls(None, None, True, True, download_timeout, min(peers.join_window, 5.0), peers.give_up_after)


@dataclass
class PeerStatus:
    """The live status of a peer: after every sync, every ``log_interval`` steps, and otherwise after
    any step that ends :data:`STATUS_EVERY_S` or more after the last status (a live line that moves
    with the steps, without a device sync to read the loss on every one of them)."""

    step: int
    round_id: int
    loss: float
    peers: int  # participants of the last sync
    bytes_up: int
    bytes_down: int
    tokens_per_s: float
    note: str = ""
    synced: bool = False  # this step ended a sync
    next_sync_s: float | None = None  # estimated seconds to the next sync (None: not known yet)
    committed: int = 0  # rounds committed so far
    failed: int = 0  # rounds late or failed so far
    committed_round: int | None = None  # the round this status's sync committed (None: none did)
    waiting: str = ""  # what the peer waits for while no step moves (``run_watch.waiting_text``)


#: seconds between two live statuses when neither a sync nor ``log_interval`` calls for one
STATUS_EVERY_S = 0.25
#: seconds between two publications of a trainer's step, rate and loss in its record between syncs
PUBLISH_EVERY_S = 5.0


class SyncClock:
    """Estimates the time to the next sync from the ones seen: the steps between the last two syncs
    (or, before that, the strategy's ``inner_steps`` when it has one) at the current step rate."""

    def __init__(self, period_hint: int | None) -> None:
        self.period = period_hint if period_hint and period_hint > 0 else None
        self.last_sync_step: int | None = None

    def synced(self, step: int) -> None:
        if self.last_sync_step is not None and step > self.last_sync_step:
            self.period = step - self.last_sync_step
        self.last_sync_step = step

    def seconds_left(self, step: int, steps_per_s: float) -> float | None:
        if self.period is None or steps_per_s <= 0:
            return None
        since = step - (self.last_sync_step or 0)
        return max(self.period - since, 0) / steps_per_s


@dataclass
class PeerRun:
    """What one peer did, as the loop counted it."""

    peer_id: str
    steps: int = 0
    tokens: int = 0
    final_train_loss: float = float("nan")
    final_val_loss: float | None = None
    final_digest: str = ""
    sync_digests: dict[int, str] = field(default_factory=dict)  # round id -> digest after that commit
    # states adopted: round, step, digest, donor
    downloads: list[dict[str, Any]] = field(default_factory=list)
    committed_rounds: int = 0
    # tokens of its own steps that went into rounds it committed (steps thrown away by a download
    # of the others' state do not count); ``pending_tokens``: its steps since its last commit
    contributed_tokens: int = 0
    pending_tokens: int = 0
    late_rounds: int = 0  # rounds formed without this peer
    late_caught_up: int = 0  # late rounds after which it adopted the state the others committed
    failed_rounds: int = 0  # rounds that failed for other reasons
    # Streaming DiLoCo: fragment -> {"committed", "late", "failed"} round counts (StepReport extra)
    fragment_rounds: dict[int, dict[str, int]] = field(default_factory=dict)
    peak_sync_bytes_sent: int = 0  # the most bytes sent in any single sync
    comm_wait_s: float = 0.0  # time the training loop waited on communication (StepReport.extra)
    bytes_sent: int = 0
    bytes_received: int = 0
    ledger: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0  # wall time of training (the download at start excluded)
    banned: dict[str, str] = field(default_factory=dict)  # peer -> reason, this peer's view at the end
    # rounds in which this peer, as an owner, reduced a sender's weight above the cap (0 while it holds)
    weights_over_cap: int = 0
    stopped_by_signal: bool = False
    device: str = ""  # where the model trained (``str(torch.device)``, e.g. ``cuda:0``)


@dataclass(frozen=True)
class PeerHooks:
    """Optional callables the loop calls at fixed points; ``None`` keeps the honest default.

    Attributes:
        wrap_collective: ``(node, collective) -> collective`` the strategy talks through.
        wrap_reducer: ``(reducer) -> reducer`` the strategy hands to ``all_reduce``.
        wrap_batches: ``(sampler, vocab_size) -> sampler`` the trainer draws batches from (same
            interface as ``BatchSampler``).
        on_status: called with the live status (see :class:`PeerStatus` for how often).
        on_finished: called with the result right after the last step, before the peer lingers.
        on_grace_over: called with the result so far when the preemption grace ends the process
            (``os._exit``: nothing after it runs, no ``finally`` and no return).
    """

    wrap_collective: Callable[[Any, Collective], Collective] | None = None
    wrap_reducer: Callable[[Reducer], Reducer] | None = None
    wrap_batches: Callable[[BatchSampler, int], BatchSampler] | None = None
    on_status: Callable[[PeerStatus], None] | None = None
    on_finished: Callable[[PeerRun], None] | None = None
    on_grace_over: Callable[[PeerRun], None] | None = None
