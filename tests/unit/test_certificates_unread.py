"""A newcomer that cannot read the run's commit certificates takes no state that time: a failed or
timed-out read is not "a run without certificates", whose weaker vouching rules two colluders pass
(``peers.state.donors.certified_states``; seen on a loaded machine, issue 30.6). Nor is a read that
came back empty while donors announce committed rounds, and an empty read of the peer records does
not lift the bound the established live peers set."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest

from peers.state import donors
from peers.state.certificates import Certificate


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
    def __init__(self, error: BaseException | None, live: tuple[str, ...] = ()) -> None:
        self.dht, self.run_id, self.peer_id = _Dht(error), "t-unread", "me"
        self.live = live

    def live_peers(self, run: str, timeout: float) -> list[Any]:
        return [SimpleNamespace(peer_id=p, committed_rounds=0) for p in self.live]


D, E = b"d" * 32, b"e" * 32
HONEST = [Certificate(p, 5, D, 4) for p in "abcd"]  # round 5, committed by a group of four
AHEAD = [Certificate(p, 6, E, 2) for p in "xy"]  # two colluders sign round 6 as a group of two


def test_a_failed_certificate_read_certifies_nothing() -> None:
    errors: list[str] = []
    states = donors.certified_states(_Node(TimeoutError()), "t-unread", frozenset(), errors)  # type: ignore[arg-type]
    assert states == {}  # no state is certified: by_certificate takes none
    assert errors and "commit certificates" in errors[0]


def test_a_run_without_certificates_keeps_the_vouching_rules() -> None:
    errors: list[str] = []
    assert donors.certified_states(_Node(None), "t-unread", frozenset(), errors) is None  # type: ignore[arg-type]
    assert errors == []


def test_an_empty_read_while_a_donor_says_it_stored_certificates_certifies_nothing() -> None:
    """A loaded DHT answers "nothing found" as readily as it times out: with a donor whose
    announcement says it stored commit certificates, an empty read is not a run without
    certificates (before: the vouching rules, the control's)."""
    errors: list[str] = []
    found = [(6, "x", b"h" * 32, 10), (5, "a", b"h" * 32, 10)]
    says = frozenset({"a"})  # a's announcement says it stored certificates
    assert donors.certified_states(_Node(None), "t-unread", frozenset(), errors, found, says) == {}  # type: ignore[arg-type]
    assert errors == ["1 donors stored commit certificates, none was read"]
    # donors that stored none (a run before its first commit, or one that does not sign): the
    # vouching rules, as in a run without certificates
    assert donors.certified_states(_Node(None), "t-unread", frozenset(), [], found) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("live", [(), ("a", "x", "y")])
def test_a_live_read_that_misses_honest_peers_keeps_them_established(
    live: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history bound counts the established peers that are live. A read of the peer records
    that came back empty, or missed honest peers whose announcements were read, must not shrink it:
    the colluders x and y would be half of what is left (before: an empty read left no bound)."""
    monkeypatch.setattr(donors, "read_certificates", lambda *a, **k: HONEST + AHEAD)
    found = [(6, p, b"h" * 32, 10) for p in "xy"] + [(5, p, b"h" * 32, 10) for p in "abcd"]
    errors: list[str] = []
    states = donors.certified_states(_Node(None, live), "t-unread", frozenset(), errors, found)  # type: ignore[arg-type]
    assert states is not None and set(states) == {5}
    assert any("round 6: 2 of the 6 established peers signed" in e for e in errors), errors
    # the control: an empty read taken as it is (nobody live) lifts the bound
    from peers.state.certificates import certified

    assert 6 in certified(HONEST + AHEAD, live=frozenset())


def test_an_announcement_says_whether_its_donor_stored_certificates() -> None:
    for says in (True, False):
        value = donors.encode_announcement(
            b"h" * 32, 10, 5, [(5, D)], b"m" * 32, leaving=False, certifies=says
        )
        assert donors.parse_announcement(value)[5] is says


def test_a_read_missing_most_certifying_donors_records_certifies_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partial read of the certificates: of the five donors whose announcements say they stored
    certificates, only the two colluders' records came back, which alone certify their round ahead.
    More than half of them unread: nothing is certified this pass. Two of five unread (a lying donor,
    or a record late): the read counts."""
    monkeypatch.setattr(donors, "read_certificates", lambda *a, **k: AHEAD)
    found = [(6, p, b"h" * 32, 10) for p in "xy"] + [(5, p, b"h" * 32, 10) for p in "abc"]
    says = frozenset("abcxy")
    errors: list[str] = []
    got = donors.certified_states(
        _Node(None, ("a", "b", "c", "x", "y")), "t-unread", frozenset(), errors, found, says
    )  # type: ignore[arg-type]
    assert got == {} and errors == ["3 of the 5 donors that stored commit certificates unread"]
    # the control: the same read when only the colluders say they stored certificates (nothing
    # unread): taken as read, their round ahead is certified
    alone = donors.certified_states(
        _Node(None, ("a", "b", "c", "x", "y")), "t-unread", frozenset(), [], found, frozenset("xy")
    )  # type: ignore[arg-type]
    assert alone is not None and 6 in alone
    # 2 of 5 unread: the read counts (a, x, y read), and a's round 5 refuses the round above it that
    # none of its live signers signed (peers.state.certificates: nothing taken below it)
    monkeypatch.setattr(donors, "read_certificates", lambda *a, **k: AHEAD + HONEST[:1])
    why: list[str] = []
    most = donors.certified_states(_Node(None, ("a", "x", "y")), "t-unread", frozenset(), why, found, says)  # type: ignore[arg-type]
    assert most is not None and 6 not in most and not any("unread" in e for e in why), why
    assert any("round 6: 0 of the 1 live signers read of round 5" in e for e in why), why
