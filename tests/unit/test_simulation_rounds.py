"""Rounds committed and failed under chaos count every incarnation of a peer: a killed process's
outcome never comes, so what it reported in its statuses (rounds committed, failed count) is kept by
the supervisor. Before, a run whose every rank was restarted at least once reported DeMo with 110
of 200 rounds committed although the survivors committed one round per step."""

from __future__ import annotations

import logging
from dataclasses import asdict, replace

from test_simulation_wait import _outcome, _result

from swarmtrain.app.peer.loop import PeerStatus
from swarmtrain.core.config import load_config
from swarmtrain.simulation.results import SimulationResult
from swarmtrain.simulation.supervisor import Supervisor


def _status(step: int, committed_round: int | None, failed: int) -> tuple[str, int, dict]:
    s = PeerStatus(step=step, round_id=step, loss=1.0, peers=2, bytes_up=0, bytes_down=0, tokens_per_s=1.0)
    return ("step", 0, asdict(replace(s, failed=failed, committed_round=committed_round, synced=True)))


def test_the_supervisor_keeps_what_a_killed_incarnation_reported() -> None:
    sup = Supervisor(load_config(None, {}, env={}), ["{}", "{}"], None, [], logging.ERROR, None)
    slot = sup.slots[0]
    slot.new_incarnation(rejoin=False)
    for msg in (_status(1, 0, 0), _status(2, None, 1), _status(3, 2, 1)):
        sup._handle(msg)
    slot.new_incarnation(rejoin=True)  # killed and restarted: its outcome never comes
    sup._handle(_status(5, 4, 0))
    res = _result([replace(_outcome(0, 0.0, 1, 2), sync_digests={4: "d", 5: "d"})])
    sup.fill(res)
    assert res.committed_seen == [0, 2, 4]
    assert res.rounds_committed == 4  # 0, 2 (killed incarnation), 4, 5 (the outcome)
    assert res.rounds_failed == 2 + 1  # the outcome's own and the killed incarnation's one
    summary = res.summary()
    assert summary["rounds_committed"] == 4 and "committed_seen" not in summary


def test_without_restarts_the_outcomes_alone_count() -> None:
    res: SimulationResult = _result([replace(_outcome(0, 0.0, 2, 1), sync_digests={0: "d", 1: "d"})])
    assert res.rounds_committed == 2 and res.rounds_failed == 1
