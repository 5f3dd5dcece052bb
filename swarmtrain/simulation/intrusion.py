"""What intruders did to a simulated run (``swarmtrain simulate --intruders K``), against a clean run.

The intruders (``swarmtrain.simulation.outsider``) count their attempts per kind and what the honest
peers let through; the honest peers' outcomes show the rest. Effects, all zero when the defences hold:

* ``rounds_failed``: rounds the honest peers failed beyond the clean run's count, late rounds after
  which the peer adopted the state the others committed left out (nothing was lost: a peer slowed
  by a loaded machine arrives after the round formed; they are reported as ``rounds_late``, beyond
  the clean run's, and the end state shows whether they cost anything: identical parameters, loss);
* ``forged_states_accepted``: states an honest peer adopted from an intruder or a colluder (admitted
  processes planting a forged state, ``swarmtrain.simulation.colluder``);
* ``honest_peers_banned``: honest peers some honest peer banned;
* ``messages_accepted``: pushed joins, lists, parts and zero-byte messages an honest peer acknowledged;
* ``bytes_accepted``: bytes of future-round messages an honest peer stored;
* ``streams_held``: stalled or trickling streams an honest peer kept open to the intruder's limit;
* ``states_served``: state downloads an honest donor served to an intruder;
* ``weights_over_cap``: rounds in which an honest owner reduced a sender's weight above the cap (the
  in-group weight attack: an admitted member claiming 1e30 for its update).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from swarmtrain.simulation.outsider import KINDS
from swarmtrain.simulation.results import PeerOutcome, SimulationResult, params_identical

__all__ = ["intrusion_summary", "honest_outcomes"]


def honest_outcomes(res: SimulationResult, attackers: int, malicious_owners: int) -> list[PeerOutcome]:
    """The outcomes of the ranks that run no attack (the attackers and malicious owners come first)."""
    return res.outcomes[attackers + malicious_owners :]


def intrusion_summary(
    run: SimulationResult, clean: SimulationResult, attackers: int = 0, malicious_owners: int = 0
) -> dict[str, Any]:
    """The JSON fields of an intruder run: attempts, effects, memory and the clean run's loss."""
    honest = honest_outcomes(run, attackers, malicious_owners)
    clean_honest = honest_outcomes(clean, attackers, malicious_owners)
    honest_ids = {o.peer_id for o in honest}
    intruder_ids = {str(r.get("peer_id")) for r in run.intruder_reports + run.colluder_reports}
    attempts: Counter[str] = Counter()
    accepted: Counter[str] = Counter()
    for r in run.intruder_reports:
        attempts.update(r.get("attempts", {}))
        accepted.update(r.get("accepted", {}))
    failed = _failed(honest) - _failed(clean_honest)
    late = sum(o.late_rounds for o in honest) - sum(o.late_rounds for o in clean_honest)
    effects = {
        "rounds_failed": max(failed, 0),
        "forged_states_accepted": sum(d in intruder_ids for o in honest for d in o.donors),
        "honest_peers_banned": len({p for o in honest for p in o.banned if p in honest_ids}),
        "messages_accepted": accepted["pushed_messages"] + accepted["zero_byte_flood"],
        "bytes_accepted": accepted["future_flood"],
        "streams_held": accepted["stalled_streams"] + accepted["trickle"],
        "states_served": accepted["state_downloads"],
        "weights_over_cap": sum(o.weights_over_cap for o in honest),
    }
    return {
        "intruders": run.intruders,
        "intruder_attempts": {k: int(attempts[k]) for k in KINDS},
        "intruder_effects": effects,
        "intruder_errors": list(run.intruder_errors),
        "rounds_late": max(late, 0),  # late rounds caught up, beyond the clean run's (not an effect)
        "colluders": run.colluders,
        # forged announcements the colluders made, and downloads of their state they served
        "colluder_announcements": sum(int(r.get("announced", 0)) for r in run.colluder_reports),
        "colluder_states_served": sum(int(r.get("served", 0)) for r in run.colluder_reports),
        # honest downloads during the run (the newcomer's): where a forged state could act
        "honest_downloads": sum(len(o.donors) for o in honest),
        "honest_identical": params_identical(honest),
        "honest_rss_growth_mib": max((o.rss_growth_mib for o in honest), default=0.0),
        "clean_rss_growth_mib": max((o.rss_growth_mib for o in clean_honest), default=0.0),
        "clean_val_loss": clean.final_val_loss,
        "loss_vs_clean": run.final_val_loss / clean.final_val_loss - 1.0,  # (dumps nulls a NaN)
    }


def _failed(outcomes: list[PeerOutcome]) -> int:
    """Rounds failed, not counting the late rounds after which the peer adopted the committed state."""
    return sum(o.failed_rounds - o.late_rounds for o in outcomes)
