"""ByteLedger: exact per-kind and per-round counts, thread safety, bounded memory."""

from __future__ import annotations

import threading

import pytest

from peers.wire.ledger import ByteLedger
from swarmtrain.core.errors import ConfigError


def test_counts_per_kind_and_round() -> None:
    led = ByteLedger()
    led.add_sent("reduce", 0, 100)
    led.add_sent("reduce", 1, 50)
    led.add_received("reduce", 1, 7)
    led.add_sent("gather", 1, 3)
    led.add_received("state", -1, 1000)
    assert led.round_bytes("reduce", 1) == (50, 7)
    assert led.round_bytes("gather", 1) == (3, 0)
    assert led.round_bytes("reduce", 9) == (0, 0)
    t = led.totals()
    assert t["sent"] == 153 and t["received"] == 1007
    assert t["by_kind"] == {
        "gather": {"sent": 3, "received": 0},
        "reduce": {"sent": 150, "received": 7},
        "state": {"sent": 0, "received": 1000},
    }
    assert led.sent == 153 and led.received == 1007
    snap = led.snapshot()
    assert {"kind": "reduce", "round": 1, "sent": 50, "received": 7} in snap["rounds"]  # type: ignore[operator]
    led.reset()
    assert led.totals()["sent"] == 0


def test_rejects_negative_and_bounds_rounds() -> None:
    led = ByteLedger(keep_rounds=3)
    with pytest.raises(ConfigError):
        led.add_sent("reduce", 0, -1)
    for r in range(10):
        led.add_sent("reduce", r, 1)
    assert len(led.snapshot()["rounds"]) == 3  # type: ignore[arg-type]
    assert led.round_bytes("reduce", 0) == (0, 0) and led.round_bytes("reduce", 9) == (1, 0)
    assert led.totals()["sent"] == 10  # totals survive eviction
    with pytest.raises(ConfigError):
        ByteLedger(keep_rounds=0)


def test_thread_safe_totals() -> None:
    led = ByteLedger()

    def work(i: int) -> None:
        for r in range(2000):
            led.add_sent("reduce", r % 7, 3)
            led.add_received("gather", i, 1)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert led.sent == 4 * 2000 * 3 and led.received == 4 * 2000
    assert sum(led.round_bytes("reduce", r)[0] for r in range(7)) == 4 * 2000 * 3
