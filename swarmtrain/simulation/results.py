"""What a local multi-peer run reports: each peer's outcome and the run's result.

Kept apart from ``swarmtrain.simulation.runner`` (which starts and supervises the processes) so that
readers of results (intrusion reports, benchmarks, tests) need not know how the run was made.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["PeerOutcome", "SimulationResult", "params_identical", "stalled_fragments"]


@dataclass
class PeerOutcome:
    """What one peer reports at the end of its run."""

    rank: int
    peer_id: str
    steps: int
    tokens: int
    final_train_loss: float
    final_val_loss: float | None
    final_digest: str
    sync_digests: dict[int, str]  # round id -> parameter digest right after that committed sync
    committed_rounds: int
    failed_rounds: int
    peak_sync_bytes_sent: int  # the most bytes this peer sent in any single sync
    comm_wait_s: float  # time the training loop waited on communication (StepReport.extra)
    bytes_sent: int
    bytes_received: int
    ledger: dict[str, Any]
    wall_s: float
    banned: dict[str, str] = field(default_factory=dict)  # peer -> reason, this peer's view at the end
    weights_over_cap: int = 0  # rounds it reduced a sender's weight above the owners' cap
    late_rounds: int = 0  # rounds formed without this peer; it then adopted the state they committed
    # attackers only: what the attack did (poisoned batches, collusion exchanges and failures)
    attack_stats: dict[str, int] = field(default_factory=dict)
    donors: list[str] = field(default_factory=list)  # the peers each adopted state came from
    rss_growth_mib: float = 0.0  # peak resident memory over the run minus that at the first step
    # Streaming DiLoCo: fragment -> {"committed", "failed"} rounds (late ones counted as failed)
    fragment_rounds: dict[int, dict[str, int]] = field(default_factory=dict)
    device: str = ""  # where the peer's model trained, e.g. ``cuda:0``


@dataclass
class SimulationResult:
    """The outcome of one simulated run (one strategy/codec over N peers)."""

    strategy: str
    compressor: str
    peers: int
    steps: int
    tokens: int
    final_val_loss: float
    params_identical: bool
    admission: str
    bytes_sent_per_peer: float
    bytes_received_per_peer: float
    wall_s: float
    peak_sync_bytes_sent: int = 0  # the most bytes any peer sent in any single sync
    compute_utilization: float = 1.0  # 1 - (time waiting on communication / training wall time)
    intruders: int = 0  # non-admitted attacker processes (``swarmtrain.simulation.outsider``)
    outcomes: list[PeerOutcome] = field(default_factory=list)
    # each intruder's last report (peer_id, attempts and accepted per kind) and any intruder failure
    intruder_reports: list[dict[str, Any]] = field(default_factory=list)
    intruder_errors: list[str] = field(default_factory=list)
    colluders: int = 0  # admitted processes planting a forged state (``swarmtrain.simulation.colluder``)
    colluder_reports: list[dict[str, Any]] = field(default_factory=list)  # each one's last report
    old_state_rules: bool = False  # the peers took states without commit certificates (a control)
    control: SimulationResult | None = None  # the same attacks run as a control (``simulate``)
    # faults: peers SIGKILLed and SIGTERMed by the chaos, restarts, deaths nobody caused
    kills: int = 0
    preemptions: int = 0
    restarts: int = 0
    deaths: int = 0
    missing_ranks: list[int] = field(default_factory=list)  # ranks with no outcome (gone at the end)
    timeline: list[dict[str, Any]] = field(default_factory=list)  # who, when (s), what
    # rounds reported committed by any incarnation of a peer, a killed one's included (its outcome
    # is lost with it), and the rounds failed or late that earlier incarnations reported
    committed_seen: list[int] = field(default_factory=list)
    failed_before_restarts: int = 0
    # the emulated regions' report under ``simulate --topology`` (the JSON's "topology"), else empty
    network: dict[str, Any] = field(default_factory=dict)
    # memory (proportional set size, ``swarmtrain.simulation.memory``): the peak of every process of
    # the run together, and each rank's peak (peer, DHT helper, p2pd) averaged over the ranks
    peak_rss_total_mib: float = 0.0
    rss_per_peer_mib: float = 0.0

    @property
    def rounds_committed(self) -> int:
        """Distinct rounds some peer committed: a peer that finished, or an incarnation of one that
        was killed or preempted before the end (from its status reports)."""
        return len({r for o in self.outcomes for r in o.sync_digests} | set(self.committed_seen))

    @property
    def rounds_failed(self) -> int:
        """Rounds failed or late, one per peer and round: those of the peers that finished plus those
        their earlier incarnations reported before a kill or preemption."""
        return sum(o.failed_rounds for o in self.outcomes) + self.failed_before_restarts

    @property
    def rounds_per_fragment(self) -> dict[int, dict[str, int]]:
        """Streaming DiLoCo: fragment -> rounds committed and failed, summed over the peers that
        finished (one per peer and round); empty for strategies without fragments."""
        out: dict[int, dict[str, int]] = {}
        for o in self.outcomes:
            for f, counts in o.fragment_rounds.items():
                acc = out.setdefault(int(f), {"committed": 0, "failed": 0})
                for k in acc:
                    acc[k] += int(counts.get(k, 0))
        return dict(sorted(out.items()))

    @property
    def stalled_fragments(self) -> list[int]:
        """Fragments no peer ever committed while another fragment did (see :func:`params_identical`)."""
        return stalled_fragments(self.outcomes)

    @property
    def comm_wait_s_per_peer(self) -> float:
        """Seconds the training loop of a peer that finished waited on communication, averaged."""
        return sum(o.comm_wait_s for o in self.outcomes) / max(len(self.outcomes), 1)

    @property
    def wait_per_round_s(self) -> float | None:
        """Seconds a training loop waited per round it took part in (committed or failed), over the
        peers that finished: a blocking strategy's round time as its loop sees it (Streaming DiLoCo
        overlaps its rounds with training, so less); ``None`` with no round."""
        rounds = sum(o.committed_rounds + o.failed_rounds for o in self.outcomes)
        return sum(o.comm_wait_s for o in self.outcomes) / rounds if rounds else None

    @property
    def bytes_per_token(self) -> float:
        """Bytes sent per peer per token that peer trained on."""
        per_peer_tokens = self.tokens / max(self.peers, 1)
        return self.bytes_sent_per_peer / max(per_peer_tokens, 1)

    def summary(self) -> dict[str, Any]:
        """Plain-data summary (no per-peer details)."""
        d = asdict(self)
        details = ("outcomes", "intruder_reports", "intruder_errors", "colluder_reports", "committed_seen")
        for detail in (*details, "network", "control"):
            d.pop(detail)
        d["bytes_per_token"] = self.bytes_per_token
        d["comm_wait_s_per_peer"] = self.comm_wait_s_per_peer
        d["wait_per_round_s"] = self.wait_per_round_s
        d["rounds_committed"] = self.rounds_committed
        d["rounds_failed"] = self.rounds_failed
        d["rounds_per_fragment"] = self.rounds_per_fragment
        d["stalled_fragments"] = self.stalled_fragments
        d["peer_devices"] = [o.device for o in self.outcomes]  # where each peer's model trained
        return d


def stalled_fragments(outcomes: list[PeerOutcome]) -> list[int]:
    """Fragments that no peer committed a round of while some other fragment committed one."""
    committed: dict[int, int] = {}
    for o in outcomes:
        for f, c in o.fragment_rounds.items():
            committed[int(f)] = committed.get(int(f), 0) + int(c.get("committed", 0))
    if not any(committed.values()):
        return []  # nothing committed at all: the run's own failure, not one fragment's
    return sorted(f for f, n in committed.items() if n == 0)


def params_identical(outcomes: list[PeerOutcome]) -> bool:
    """True when every peer ends bit-identical and agreed after every round all of them committed.

    Not when a fragment never committed while others did (Streaming DiLoCo): its global parameters
    are then the initial ones on every peer, identical without a single agreement, while each peer's
    local copy of it trained alone."""
    if len({o.final_digest for o in outcomes}) != 1 or stalled_fragments(outcomes):
        return False
    common = set.intersection(*(set(o.sync_digests) for o in outcomes)) if outcomes else set()
    return all(len({o.sync_digests[r] for o in outcomes}) == 1 for r in common)
