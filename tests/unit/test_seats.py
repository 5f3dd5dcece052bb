"""The seat rule for strangers under ``open`` (``peers.rounds.seats.Seats``) and how the matchmaker
applies it, on an in-memory DHT.

Pure logic; the real-peer measurement (two stalling intruders) is
``tests/integration/test_open_seats.py``.
"""

from __future__ import annotations

import time

import msgpack
import pytest
from test_rounds import FakeDHT

from peers.dht.node import dht_time
from peers.rounds.round_errors import ListsBannedPeer
from peers.rounds.rounds import Matchmaker, Pushes
from peers.rounds.seats import BACKOFF_ROUNDS, Seats, TooManyNewcomers, View, newcomer_seats
from peers.state.certificates import Certified

OLD = ("E1", "E2", "E3")  # established: signed the certified state of round 4
NEW = ("0n", "0m")  # newcomers whose IDs sort before every established one


def _state(rnd: int, signers: tuple[str, ...]) -> Certified:
    return Certified(rnd, b"d" * 32, frozenset(signers), len(signers))


def _seats(live: frozenset[str] | None = None) -> Seats:
    s = Seats()
    s.note([_state(4, OLD)], live)
    return s


def test_newcomer_seats_at_least_one_and_fewer_than_the_established() -> None:
    assert [newcomer_seats(n) for n in range(7)] == [1, 1, 1, 1, 2, 2, 3]


def test_without_a_certified_history_nothing_changes() -> None:
    s = Seats()
    joined = ["0n", "E1", "E2"]
    assert not s.active(10)
    assert s.leader(joined, 10) == "0n"
    assert s.seat(joined, 10) == ("0n", "E1", "E2")
    assert s.breaks(["0n", "0m", "E1"], 10) is None
    assert s.may_lead("0n", joined, 10) and not s.may_lead("E1", joined, 10)


def test_a_certified_round_counts_from_the_round_after_it() -> None:
    """A state committed in round 3 is announced (and certified) as round 4: its signers are
    established from round 5 on, when every member's read at the round start holds it."""
    s = _seats()
    assert s.established(4) == frozenset() and not s.active(4)
    assert s.established(5) == frozenset(OLD) and s.active(5)
    s.note([_state(9, ("E1", "X"))], None)  # a later certificate does not move the first round
    assert s.first["E1"] == 4 and s.first["X"] == 9


def test_the_rule_is_off_once_every_established_peer_left() -> None:
    assert _seats(live=frozenset({"E2", "0n"})).active(5)
    assert not _seats(live=frozenset({"0n", "0m"})).active(5)


def test_only_an_established_joiner_leads_even_with_a_larger_id() -> None:
    s = _seats()
    assert s.leader(["0m", "0n", "E2", "E3"], 5) == "E2"
    assert s.leader(["0m", "0n"], 5) is None  # newcomers only: nobody leads yet
    assert not s.may_lead("0n", ["0n", "E1", "E2"], 5)
    assert s.may_lead("E2", ["0n", "E1", "E2"], 5)  # not the smallest established: still valid
    assert not s.may_lead("E2", ["0n", "E1"], 5)  # not on its own list


def test_a_leader_seats_a_bounded_share_of_newcomers() -> None:
    s = _seats()
    seated = s.seat(["0m", "0n", "E1", "E2", "E3"], 5)
    assert set(OLD) <= set(seated) and len(seated) == 4 and list(seated) == sorted(seated)
    s.note([_state(4, ("E4",))], None)
    assert len(s.seat(["0a", "0b", "0c", "E1", "E2", "E3", "E4"], 5)) == 6  # 4 established: 2 seats


def test_a_round_that_needs_more_members_seats_newcomers_up_to_its_minimum() -> None:
    """A leader whose view lacks the others' certificates (a store or read that failed under load)
    still closes a round of ``min_peers``: newcomers are seated up to it, those backing off last."""
    s = _seats()
    assert s.seat(["0m", "0n", "E1"], 5, needs=3) == ("0m", "0n", "E1")  # 1 seat by the rule alone
    assert len(s.seat(["0m", "0n", "E1"], 5, needs=2)) == 2
    s.failed(["0n", "E1"], 10)  # 0n backs off
    assert s.seat(["0m", "0n", "E1", "E2"], 11, needs=3) == ("0m", "E1", "E2")  # the free one first
    assert s.seat(["0n", "E1", "E2"], 11, needs=3) == ("0n", "E1", "E2")  # barred, but needed
    assert s.seat(["0n", "E1", "E2"], 11, needs=2) == ("E1", "E2")


def test_which_newcomer_is_seated_changes_with_the_round() -> None:
    s = _seats()
    picks = {s.seat(["0m", "0n", "E1", "E2", "E3"], r)[0] for r in range(5, 25)}
    assert picks == {"0m", "0n"}


def test_a_list_with_too_many_newcomers_breaks_the_rule() -> None:
    s = _seats()
    assert s.breaks(["0n", "E1", "E2", "E3"], 5) is None
    assert "2 members without history for 1 seats" in str(s.breaks(["0m", "0n", "E1", "E2", "E3"], 5))
    assert s.breaks(["0m", "0n", "E1"], 4) is None  # the rule is not active yet in round 4


def test_a_newcomer_of_a_failed_round_backs_off_longer_each_time() -> None:
    s = _seats()
    s.failed(["0n", "E1", "E2", "E3"], 10)
    assert s.barred("0n", 10 + BACKOFF_ROUNDS) and not s.barred("0n", 11 + BACKOFF_ROUNDS)
    assert not s.barred("0m", 11) and not s.barred("E1", 11)  # established members never back off
    # meanwhile the other newcomer gets the seat every round
    assert all("0m" in s.seat(["0m", "0n", "E1", "E2", "E3"], r) for r in range(11, 27))
    s.failed(["0n", "E1", "E2", "E3"], 30)
    assert s.barred("0n", 30 + 2 * BACKOFF_ROUNDS) and not s.barred("0n", 31 + 2 * BACKOFF_ROUNDS)
    s.failed(["0m", "0n", "E1"], 4)  # rule not active in round 4: no back-off
    assert not s.barred("0m", 5)


def test_only_a_newcomer_the_failure_names_as_missing_backs_off() -> None:
    """A round that failed waiting for an established member (it was killed) bars no newcomer; one
    that waited for a newcomer bars that one only; a failure that names nobody bars every newcomer."""
    s = _seats()
    s.failed(["0m", "0n", "E1", "E2"], 10, missing=("E2",))
    assert not s.barred("0m", 11) and not s.barred("0n", 11)
    s.failed(["0m", "0n", "E1", "E2"], 12, missing=("0n", "E2"))
    assert s.barred("0n", 13) and not s.barred("0m", 13)
    s.failed(["0m", "E1", "E2"], 14, missing=())
    assert s.barred("0m", 15)


def test_the_rule_is_on_under_open_only() -> None:
    from types import SimpleNamespace

    node = SimpleNamespace(run_id="r")  # for_node keeps a reader of the node's DHT; nothing is read yet
    assert isinstance(Seats.for_admission(node, "open"), Seats)
    assert Seats.for_admission(node, "token") is None and Seats.for_admission(node, "allowlist") is None


def test_a_round_failure_names_the_members_it_waited_for() -> None:
    from peers.rounds.round_errors import MemberAborted, MemberGone, RoundTimeout

    assert RoundTimeout("t", missing=("a", "b")).missing == ("a", "b")
    assert MemberGone("g").missing == () and MemberAborted("x").missing == ()


def test_the_established_members_of_the_last_group_are_waited_for() -> None:
    s = _seats()
    assert s.waiting(["E1", "E2", "0n"], ["E1", "0n", "0m"], 5) == frozenset({"E2"})
    assert s.waiting(["E1", "E2"], ["E1"], 4) == frozenset()  # inactive


def test_a_recheck_reads_again_at_most_once_a_second() -> None:
    reads: list[float] = []

    def read(timeout: float) -> View:
        reads.append(timeout)
        return [_state(4, OLD)], None

    s = Seats(read)
    s.refresh(2.0)
    assert not s.recheck() and len(reads) == 1
    s._read_at -= 1.5
    assert s.recheck() and len(reads) == 2 and s.active(5)


def test_too_many_newcomers_is_refused_like_a_banned_peer() -> None:
    assert issubclass(TooManyNewcomers, ListsBannedPeer)


# --- the matchmaker under the rule -------------------------------------------------------------------


def _mm(dht: FakeDHT, me: str, expected: int, joins: frozenset[str], window: float = 30.0) -> tuple:
    pushed: list[tuple[str, ...]] = []

    def inbox(kind: str, r: int, wait_s: float, n_joins: int) -> tuple[dict, frozenset]:
        time.sleep(min(wait_s, 0.01))
        return {}, joins

    pushes = Pushes(inbox, lambda kind, r, members, value: pushed.append(members), lambda k, r, p: None)
    mm = Matchmaker(
        dht,
        me,
        "run",
        pushes,
        min_peers=1,
        expected_peers=expected,
        join_window=window,
        poll=0.01,
        seats=_seats(),
    )
    return mm, pushed


def _record(dht: FakeDHT, rnd: int, leader: str, members: list[str]) -> None:
    value = bytes(msgpack.packb(members))
    dht.store(f"run.reduce.{rnd}.group", value, dht_time() + 60, subkey=leader, return_future=True)


def test_an_established_leader_seats_one_newcomer_though_a_newcomer_has_the_smallest_id() -> None:
    dht = FakeDHT()
    mm, pushed = _mm(dht, "E1", 5, frozenset({"0m", "0n", "E2", "E3"}))
    group = mm.form_group("reduce", 5, deadline=time.monotonic() + 10)
    assert group.leader == "E1" and len(group.members) == 4 and set(OLD) <= set(group.members)
    assert pushed == [group.members]


def test_a_newcomer_neither_leads_nor_follows_a_newcomers_list() -> None:
    """0n has the smallest ID: it waits for an established leader, ignoring 0m's list of itself."""
    dht = FakeDHT()
    _record(dht, 5, "0m", ["0m", "0n", "E1", "E2"])
    _record(dht, 5, "E1", ["0n", "E1", "E2", "E3"])
    mm, pushed = _mm(dht, "0n", 4, frozenset({"0m", "E1", "E2", "E3"}))
    group = mm.form_group("reduce", 5, deadline=time.monotonic() + 10)
    assert group.leader == "E1" and group.members == ("0n", "E1", "E2", "E3") and pushed == []


def test_a_list_seating_too_many_newcomers_is_refused() -> None:
    dht = FakeDHT()
    _record(dht, 5, "E1", ["0m", "0n", "E1", "E2"])
    mm, _ = _mm(dht, "E2", 4, frozenset())
    with pytest.raises(TooManyNewcomers) as e:
        mm.form_group("reduce", 5, deadline=time.monotonic() + 10)
    assert e.value.group.members == ("0m", "0n", "E1", "E2")


def test_a_leader_does_not_close_early_without_an_established_member_of_its_last_group() -> None:
    """Four joined (the expected number) but E3, of the last group, did not: the leader waits its
    join window instead of closing with a newcomer in E3's place."""
    dht = FakeDHT()
    mm, _ = _mm(dht, "E1", 4, frozenset({"0m", "0n", "E2"}), window=0.6)
    mm.last_members = OLD
    t0 = time.monotonic()
    group = mm.form_group("reduce", 5, deadline=t0 + 10)
    assert time.monotonic() - t0 >= 0.5
    assert group.leader == "E1" and len(group.members) == 3  # E1, E2 and one newcomer
