"""Which step a SWARM server reads its replicas at (``swarmtrain.app.swarm_server._stage_step``):
the evidence a restarted server that took itself for its stage's first server uses to find out it
is behind. Pure logic on records; the real processes are in
``tests/integration/test_swarm_simulate.py`` (``--chaos``)."""

from __future__ import annotations

from peers.swarm.routing import ServerInfo
from swarmtrain.app.swarm_server import _stage_step


def test_the_highest_step_of_the_other_servers_of_the_stage() -> None:
    live = [
        ServerInfo("me", 0, version=0),
        ServerInfo("a", 0, version=41),
        ServerInfo("b", 0, version=42),
        ServerInfo("c", 1, version=99),  # another stage
    ]
    assert _stage_step(live, 0, "me") == 42
    assert _stage_step(live, 1, "me") == 99


def test_its_own_old_record_and_catching_up_servers_are_no_evidence() -> None:
    # a restart with the same identity may still see its killed self's record; a server catching
    # up announces the steps it follows, not parameters it holds
    live = [ServerInfo("me", 0, version=70), ServerInfo("a", 0, version=70, syncing=True)]
    assert _stage_step(live, 0, "me") is None
    assert _stage_step([], 0, "me") is None
