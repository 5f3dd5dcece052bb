"""A state announcement that failed (a loaded DHT) is tried again within seconds, not a third of
its TTL later: until it is stored, newcomers see only an older certified state and adopt that one
(``test_rejoin`` failed so once: a newcomer took round 2's state while the run was at round 4)."""

from __future__ import annotations

import threading
import time

from peers.state import state_transfer
from peers.state.state_transfer import StateServer


def _bare(results: list[bool], ttl: float) -> tuple[StateServer, list[float]]:
    """A ``StateServer`` with only what its announce loop uses; its store answers ``results`` in turn."""
    server = StateServer.__new__(StateServer)
    server.announce_ttl = ttl
    server._stop, server._failed = threading.Event(), threading.Event()
    calls: list[float] = []

    def store() -> bool:
        calls.append(time.monotonic())
        return results.pop(0) if results else True

    server._store_announcement = store  # type: ignore[method-assign]
    return server, calls


def test_a_failed_announcement_is_tried_again_soon(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(state_transfer, "RETRY_ANNOUNCE_S", 0.05)
    server, calls = _bare([False, False, True], ttl=3600.0)
    assert server._announce() is False and server._failed.is_set()  # refresh's own try failed
    loop = threading.Thread(target=server._reannounce, daemon=True)
    loop.start()
    deadline = time.monotonic() + 10.0
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # once stored, nothing more until a third of the TTL (an hour here)
    server._stop.set()
    loop.join(5.0)
    assert len(calls) == 3 and not server._failed.is_set()


def test_without_failures_it_announces_every_third_of_the_ttl(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(state_transfer, "RETRY_ANNOUNCE_S", 0.02)
    server, calls = _bare([], ttl=0.6)
    loop = threading.Thread(target=server._reannounce, daemon=True)
    loop.start()
    time.sleep(1.1)
    server._stop.set()
    loop.join(5.0)
    assert 1 <= len(calls) <= 10  # about every 0.2 s (5), not at every 0.02 s tick (55)
