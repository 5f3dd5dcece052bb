"""A newcomer that cannot read the run's commit certificates takes no state that time: a failed or
timed-out read is not "a run without certificates", whose weaker vouching rules two colluders pass
(``peers.state.donors.certified_states``; seen on a loaded machine, issue 30.6)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from peers.state import donors


class _Dht:
    """A DHT whose read of ``key`` fails with ``error``, or finds nothing (``error`` None)."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def get(self, key: str, latest: bool, return_future: bool) -> Future[Any]:
        f: Future[Any] = Future()
        if self.error is not None:
            f.set_exception(self.error)
        else:
            f.set_result(None)
        return f


class _Node:
    def __init__(self, error: BaseException | None) -> None:
        self.dht, self.run_id, self.peer_id = _Dht(error), "t-unread", "me"

    def live_peers(self, run: str, timeout: float) -> list[Any]:
        return []


def test_a_failed_certificate_read_certifies_nothing() -> None:
    errors: list[str] = []
    states = donors.certified_states(_Node(TimeoutError()), "t-unread", frozenset(), errors)  # type: ignore[arg-type]
    assert states == {}  # no state is certified: by_certificate takes none
    assert errors and "commit certificates" in errors[0]


def test_a_run_without_certificates_keeps_the_vouching_rules() -> None:
    errors: list[str] = []
    assert donors.certified_states(_Node(None), "t-unread", frozenset(), errors) is None  # type: ignore[arg-type]
    assert errors == []
