"""A trainer's record carries live figures between syncs (``swarmtrain.app.peer.loop``): step, tokens
per second and loss are published every ``PUBLISH_EVERY_S`` seconds, so ``swarmtrain status`` and the
dashboard show a trainer that trains (not ``step 0, tok/s 0, loss -`` until its first round)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from swarmtrain.app.peer import loop as loop_mod
from swarmtrain.app.peer.contract import PUBLISH_EVERY_S, PeerHooks, PeerRun, SyncClock


class _Node:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []
        self.ledger = SimpleNamespace(sent=0, received=0)

    def publish(self, **fields: Any) -> None:
        self.published.append(fields)


def _peer(node: _Node) -> Any:
    """A ``_Peer`` with only what ``on_step`` reads between syncs."""
    peer = object.__new__(loop_mod._Peer)
    peer.node, peer.result, peer.watch, peer.hooks = node, PeerRun(peer_id="me"), None, PeerHooks()
    peer.trainer = SimpleNamespace(step=0, tokens_per_step=100)
    peer.p2p = SimpleNamespace(round_id=3)
    peer.cfg = SimpleNamespace(train=SimpleNamespace(log_interval=10))
    peer.stop = SimpleNamespace(requested=False)
    peer.own_admission = SimpleNamespace(check=lambda: None)
    peer._pending_tokens = 0  # tokens of its steps since its last commit (issue 31.6)
    peer._clock, peer._published, peer._last_status, peer._step_t, peer._sync_s = (
        SyncClock(50),
        0.0,
        0.0,
        0.0,
        0.0,
    )
    return peer


def test_a_trainer_publishes_its_step_rate_and_loss_every_few_seconds_between_syncs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(loop_mod.time, "monotonic", lambda: clock[0])
    node = _Node()
    peer = _peer(node)
    report = SimpleNamespace(synced=False, extra={})
    for step in range(1, 41):  # 40 steps, 2 a second, no sync
        peer.trainer.step = step
        peer.on_step(SimpleNamespace(step=step, report=report, tokens_per_s=200.0, loss=3.5 - step / 100))
        clock[0] += 0.5
    assert len(node.published) == 40 * 0.5 // PUBLISH_EVERY_S  # every 5 s, not every step
    last = node.published[-1]
    assert set(last) == {"step", "throughput", "loss"} and last["throughput"] == 200.0
    assert last["step"] > 30 and last["loss"] == pytest.approx(3.5 - last["step"] / 100)
