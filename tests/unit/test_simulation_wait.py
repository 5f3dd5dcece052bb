"""``SimulationResult``'s communication wait figures (``comm_wait_s_per_peer``, ``wait_per_round_s``),
which ``benchmarks/wan_utilization.py`` reports per strategy: plain arithmetic over the outcomes."""

from __future__ import annotations

import pytest

from swarmtrain.simulation.results import PeerOutcome, SimulationResult


def _outcome(rank: int, wait_s: float, committed: int, failed: int) -> PeerOutcome:
    return PeerOutcome(
        rank=rank,
        peer_id=f"p{rank}",
        steps=10,
        tokens=100,
        final_train_loss=1.0,
        final_val_loss=1.0,
        final_digest="same",
        sync_digests={},
        committed_rounds=committed,
        failed_rounds=failed,
        peak_sync_bytes_sent=1,
        comm_wait_s=wait_s,
        bytes_sent=1,
        bytes_received=1,
        ledger={},
        wall_s=10.0,
    )


def _result(outcomes: list[PeerOutcome]) -> SimulationResult:
    return SimulationResult(
        strategy="diloco",
        compressor="int8",
        peers=len(outcomes),
        steps=10,
        tokens=100 * len(outcomes),
        final_val_loss=1.0,
        params_identical=True,
        admission="token",
        bytes_sent_per_peer=1.0,
        bytes_received_per_peer=1.0,
        wall_s=10.0,
        outcomes=outcomes,
    )


def test_wait_per_round_counts_every_round_a_peer_took_part_in() -> None:
    res = _result([_outcome(0, 6.0, 2, 1), _outcome(1, 2.0, 1, 0)])
    assert res.comm_wait_s_per_peer == pytest.approx(4.0)
    assert res.wait_per_round_s == pytest.approx(8.0 / 4)
    summary = res.summary()
    assert summary["wait_per_round_s"] == pytest.approx(2.0)
    assert summary["comm_wait_s_per_peer"] == pytest.approx(4.0)


def test_no_round_means_no_wait_per_round() -> None:
    res = _result([_outcome(0, 0.0, 0, 0)])
    assert res.wait_per_round_s is None and res.summary()["wait_per_round_s"] is None
