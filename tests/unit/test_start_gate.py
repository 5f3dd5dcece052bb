"""simulate's peers start together (``swarmtrain.app.peer.start_gate``) and many peers on few cores
get a join window their spread of arrivals fits (``crowded_join_window``).

The gate's logic runs here against a stand-in for the DHT node (what it reads is the run's peer
records); the real-process check is ``swarmtrain simulate --peers 16`` (``benchmarks/scale.py``):
without the gate and the window, 16 peers on 2 cores started 21 s apart and 40 of 48 peer-rounds
were late; with both, every round of the 16 committed with all of them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from peers.dht.records import PeerRecord
from swarmtrain.app.commands.simulate import SimulateOptions
from swarmtrain.app.local_run import CROWD_FREE, crowded_join_window
from swarmtrain.app.peer.start_gate import READY, start_together
from swarmtrain.core.errors import PeerTimeoutError


class _Node:
    """The run's peer records as the DHT returns them: ``ready_after[i]`` is the read from which
    peer ``i`` says it is ready (``None``: never); the first read times out when ``flaky``."""

    def __init__(self, ready_after: list[int | None], flaky: bool = False) -> None:
        self.ready_after, self.flaky, self.reads = ready_after, flaky, 0
        self.published: dict[str, Any] = {}

    def publish(self, **fields: Any) -> None:
        self.published.update(fields)

    def live_peers(self, timeout: float) -> list[PeerRecord]:
        self.reads += 1
        if self.flaky and self.reads == 1:
            raise PeerTimeoutError("the DHT did not answer")
        out = [PeerRecord(peer_id="boot", run_id="r", role="bootstrap", extra={READY: 1})]
        for i, after in enumerate(self.ready_after):
            ready = after is not None and self.reads >= after
            out.append(PeerRecord(peer_id=f"p{i}", run_id="r", extra={READY: 1} if ready else {}))
        return out


class _Stop:
    def __init__(self, after_waits: int | None = None) -> None:
        self.waits, self.after = 0, after_waits

    @property
    def requested(self) -> bool:
        return self.after is not None and self.waits >= self.after

    def wait(self, timeout: float) -> bool:
        self.waits += 1
        return self.requested


def test_a_peer_waits_until_every_trainer_of_the_run_is_ready() -> None:
    node = _Node([1, 3, 5], flaky=True)  # the bootstrap's record does not count, a timed-out read is 0
    start_together(node, 3, _Stop(), timeout=60)
    assert node.published == {READY: 1} and node.reads == 5


def test_the_gate_ends_on_a_stop_or_its_time_limit() -> None:
    node = _Node([1, None])
    start_together(node, 2, _Stop(after_waits=3), timeout=60)
    assert node.reads == 4  # one look before the first wait, one after each
    node = _Node([1, None])
    waited = start_together(node, 2, _Stop(), timeout=0.0)  # a peer that never comes: it starts
    assert waited >= 0 and node.reads == 1


def test_many_peers_on_few_cores_get_a_wider_join_window() -> None:
    assert crowded_join_window(8, 2) is None and crowded_join_window(int(CROWD_FREE), 1) is None
    assert crowded_join_window(16, 2) == 16.0 and crowded_join_window(64, 2) == 64.0
    assert crowded_join_window(16, 16) is None  # one core per peer: the hand-set window holds
    cpus = os.cpu_count() or 1
    many = int(CROWD_FREE * cpus) + cpus
    assert SimulateOptions(peers=many).load_config().peers.join_window == crowded_join_window(many, cpus)
    assert SimulateOptions(peers=2).load_config().peers.join_window == 3.0


def test_a_configured_join_window_wins_over_the_crowded_one(tmp_path: Path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text("[peers]\njoin_window = 5.0\n")
    cpus = os.cpu_count() or 1
    opts = SimulateOptions(peers=int(CROWD_FREE * cpus) + cpus, config=cfg)
    assert opts.load_config().peers.join_window == 5.0
