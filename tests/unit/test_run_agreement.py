"""A volunteer's settings against the live trainers' records (``swarmtrain.app.peer.run_agreement``)."""

from __future__ import annotations

import logging

import pytest

from peers.dht.records import PeerRecord
from swarmtrain.app.peer.run_agreement import check_agreement, run_settings
from swarmtrain.core.config import load_config
from swarmtrain.core.errors import ConfigError


def _trainer(i: int, **extra: str | int) -> PeerRecord:
    return PeerRecord(peer_id=f"peer{i}", run_id="r", role="trainer", extra=dict(extra))


OURS = {"strategy": "diloco", "inner_steps": 50, "codec": "int8", "reducer": "mean", "byzantine_f": 0}


def test_the_settings_a_peer_publishes() -> None:
    cfg = load_config(
        None, {"strategy.name": "diloco", "strategy.inner_steps": 7, "compression.codec": "ternary"}
    )
    assert run_settings(cfg) == {
        "strategy": "diloco",
        "codec": "ternary",
        "reducer": cfg.peers.reducer,
        "byzantine_f": cfg.peers.byzantine_f,
        "inner_steps": 7,
    }
    assert "inner_steps" not in run_settings(load_config(None, {"strategy.name": "data_parallel"}))


def test_unanimous_trainers_with_another_codec_refuse_the_volunteer_in_one_line() -> None:
    recs = [_trainer(i, **{**OURS, "codec": "ternary"}) for i in range(3)]
    with pytest.raises(ConfigError) as e:
        check_agreement(OURS, recs, "me")
    assert str(e.value) == (
        "this run's trainers use codec 'ternary' (3 of 3); this peer is set to 'int8': join with "
        "--compressor ternary (or the run's config file)"
    )


def test_agreement_itself_old_records_and_non_trainers_pass() -> None:
    recs = [_trainer(0, **OURS), _trainer(1), PeerRecord(peer_id="b", run_id="r", role="bootstrap")]
    recs.append(_trainer(9, **{**OURS, "codec": "none"}))  # our own record, whatever it says
    check_agreement(OURS, recs, "peer9")
    check_agreement(OURS, [], "me")


def test_disagreeing_trainers_are_a_warning_so_a_stranger_cannot_turn_volunteers_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recs = [_trainer(0, **OURS), *(_trainer(i, **{**OURS, "strategy": "demo"}) for i in range(1, 5))]
    with caplog.at_level(logging.WARNING):
        check_agreement(OURS, recs, "me")
    assert "disagree on strategy: 'demo' (4), 'diloco' (1)" in caplog.text
