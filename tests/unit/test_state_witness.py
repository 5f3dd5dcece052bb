"""Which donors' announced rounds the other peers bear out (``peers.state.donors.witnessed``).

Pure logic on records and announcements; the real-peer case (a forged far-future round refused) is in
``tests/integration/test_state_transfer.py``.
"""

from __future__ import annotations

from typing import Any

from peers.dht.records import PeerRecord
from peers.state.donors import ROUND_SLACK, witnessed


class _Node:
    peer_id = "me"

    def __init__(self, rounds: dict[str, int]) -> None:
        self.rounds = rounds

    def live_peers(self, run: str, timeout: float) -> list[PeerRecord]:
        return [PeerRecord(peer_id=p, run_id=run, round=r) for p, r in self.rounds.items()]


def _ann(rnd: int, peer: str) -> tuple[int, str, bytes, int]:
    return (rnd, peer, b"d", 10)


def _kept(node: Any, found: list[tuple[int, str, bytes, int]]) -> list[str]:
    errors: list[str] = []
    return [a[1] for a in witnessed(node, "run", found, errors)]


def test_honest_donors_bear_each_other_out_when_the_records_lag() -> None:
    """Records say round 3 (a loaded DHT stores them late); two donors just committed round 9: both
    stand. Judged on records alone, a late peer refused every donor until its download timed out."""
    node = _Node({"a": 3, "b": 3, "c": 3})
    assert _kept(node, [_ann(9, "a"), _ann(9, "b")]) == ["a", "b"]


def test_a_lone_far_future_claim_is_refused() -> None:
    node = _Node({"a": 9, "b": 9, "x": 9})
    kept = _kept(node, [_ann(10**12, "x"), _ann(9, "a"), _ann(9 + ROUND_SLACK, "b")])
    assert kept == ["a", "b"]


def test_newcomers_and_this_peer_are_no_witnesses() -> None:
    """Round-0 peers and this peer's own record do not bound anything: a single donor stands."""
    node = _Node({"me": 1, "n": 0, "a": 50})
    assert _kept(node, [_ann(50, "a")]) == ["a"]
