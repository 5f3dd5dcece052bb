"""The chaos of a SWARM run (``swarmtrain.simulation.swarm_chaos``): whom it may take, when it
restarts. Pure logic on stand-in servers; the real processes are in
``tests/integration/test_swarm_simulate.py``."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field

from swarmtrain.simulation.chaos import ChaosSpec
from swarmtrain.simulation.swarm_chaos import ServerChaos, victims


@dataclass
class _Proc:
    pid: int
    alive: bool = True
    signals: list[int] = field(default_factory=list)
    terminated: bool = False

    def signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGKILL:
            self.alive = False

    def terminate(self, grace: float = 5.0) -> bool:
        self.terminated, self.alive = True, False
        return True


@dataclass
class _Server:
    rank: int
    stage: int
    serving: bool = True
    killed: bool = False
    proc: _Proc = field(default_factory=lambda: _Proc(0))


def test_a_stage_keeps_a_server_that_serves_in_step() -> None:
    a, b, c = _Server(0, 0), _Server(1, 0, serving=False), _Server(2, 1)
    # stage 0: a serves, b catches up -> only b may go (a is its stage's only state); stage 1 alone
    assert victims([a, b, c]) == [b]
    b.serving = True
    assert victims([a, b, c]) == [a, b]
    a.killed = True
    assert victims([a, b, c]) == []


def _chaos(servers: list[_Server], spec: ChaosSpec) -> ServerChaos:
    def spawn(rank: int, stage: int) -> _Server:
        servers.append(_Server(rank, stage, serving=False, proc=_Proc(100 + len(servers))))
        return servers[-1]

    return ServerChaos(spec, seed=0, spawn=spawn, t0=0.0, preempt_grace=5.0)


def test_faults_wait_for_the_trainers_then_kill_and_restart_with_the_same_rank_and_stage() -> None:
    servers = [_Server(r, r % 2, proc=_Proc(r)) for r in range(4)]
    sc = _chaos(servers, ChaosSpec(kill_per_s=1.0, restart_s=2.0))
    sc.tick(0.0, servers, started=False, progress=0.0)
    sc.tick(5.0, servers, started=False, progress=0.0)
    assert sc.counts["kill"] == 0  # no trainer has completed a micro-batch yet
    sc.tick(10.0, servers, started=True, progress=0.1)  # anchors the schedule
    sc.tick(11.0, servers, started=True, progress=0.2)  # the first period's fault is due
    assert sc.counts["kill"] == 1
    gone = [s for s in servers if s.killed]
    assert len(gone) == 1 and gone[0].proc.signals == [signal.SIGKILL]
    sc.tick(12.5, servers, started=True, progress=0.2)  # restart due at 13.0 at the earliest
    assert sc.counts["restart"] == 0
    sc.tick(13.05, servers, started=True, progress=0.3)
    back = servers[4]
    assert sc.counts["restart"] == 1 and (back.rank, back.stage) == (gone[0].rank, gone[0].stage)
    assert gone[0].proc.terminated  # its group's leftovers were cleaned before the new process
    events = [e["event"] for e in sc.timeline]
    assert events[0] == "kill" and events.index("restart") > 0


def test_a_preempted_server_is_restarted_only_once_it_left() -> None:
    servers = [_Server(r, 0, proc=_Proc(r)) for r in range(2)]
    sc = _chaos(servers, ChaosSpec(preempt_per_s=1.0, restart_s=1.0))
    sc.tick(0.0, servers, started=True, progress=0.1)
    sc.tick(1.0, servers, started=True, progress=0.1)
    (left,) = [s for s in servers if s.killed]
    assert left.proc.signals == [signal.SIGTERM] and left.proc.alive
    sc.tick(3.0, servers, started=True, progress=0.2)
    assert sc.counts["restart"] == 0  # still leaving: one process per identity
    left.proc.alive = False
    sc.tick(3.1, servers, started=True, progress=0.2)
    assert sc.counts["restart"] == 1


def test_a_preempted_server_that_overstays_its_grace_is_killed() -> None:
    servers = [_Server(r, 0, proc=_Proc(r)) for r in range(2)]
    sc = _chaos(servers, ChaosSpec(preempt_per_s=1.0))
    sc.tick(0.0, servers, started=True, progress=0.1)
    sc.tick(1.0, servers, started=True, progress=0.1)
    (left,) = [s for s in servers if s.killed]
    sc.tick(10.0, servers, started=True, progress=0.2)
    assert not left.proc.terminated  # within grace (5 s) plus slack
    sc.tick(17.0, servers, started=True, progress=0.2)
    assert left.proc.terminated


def test_no_fault_near_the_end_and_no_restart_at_it() -> None:
    servers = [_Server(r, 0, proc=_Proc(r)) for r in range(3)]
    sc = _chaos(servers, ChaosSpec(kill_per_s=1.0, restart_s=1.0))
    sc.tick(0.0, servers, started=True, progress=0.1)
    sc.tick(1.0, servers, started=True, progress=0.5)
    assert sc.counts["kill"] == 1
    sc.tick(5.0, servers, started=True, progress=0.95)
    assert sc.counts["kill"] == 1 and sc.counts["restart"] == 0
    assert sc.timeline[-1]["event"] == "not_restarted"


def test_a_restart_still_pending_when_the_trainers_finish_is_in_the_timeline() -> None:
    servers = [_Server(r, 0, proc=_Proc(r)) for r in range(3)]
    sc = _chaos(servers, ChaosSpec(kill_per_s=1.0, restart_s=30.0))
    sc.tick(0.0, servers, started=True, progress=0.1)
    sc.tick(1.0, servers, started=True, progress=0.5)
    (gone,) = [s for s in servers if s.killed]
    sc.finish(2.0)  # its restart was due at 31 s
    last = sc.timeline[-1]
    assert (last["event"], last["rank"], sc.pending) == ("not_restarted", gone.rank, [])


def test_a_server_that_never_caught_up_and_met_nobody_holds_no_replica() -> None:
    from swarmtrain.simulation.swarm_result import is_replica as _replica

    assert _replica({"in_step": True, "final_group": 0})  # served in step: its own parameters
    assert _replica({"in_step": False, "final_group": 2})  # late, but its last average met a replica
    assert not _replica({"in_step": False, "final_group": 1})  # restarted too late, met nobody
    assert _replica({"final_group": 0})  # a report from before the field: in step


@dataclass
class _Round:
    committed: bool = False
    participants: tuple[str, ...] = ()


@dataclass
class _LoneSync:
    """A stage sync whose rounds find nobody: a server preempted while its stage's others serve on."""

    stage: int = 0
    timeout: float = 20.0
    rounds: list[int] = field(default_factory=list)

    def sync(self, round_id: int, weight: float = 1.0) -> _Round:
        self.rounds.append(round_id)
        return _Round()


def test_a_lone_leaver_starts_no_last_average_past_its_grace() -> None:
    import time

    from swarmtrain.app.swarm.roles import final_sync

    s = _LoneSync()
    final_sync(None, s, 100, deadline=time.monotonic() - 1.0)  # the first round took the grace
    assert s.rounds == [100]
    s = _LoneSync()
    final_sync(None, s, 100, deadline=time.monotonic() + 60.0)  # time left: the retries go on
    assert s.rounds == [100, 101, 102, 103]
