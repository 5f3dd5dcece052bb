"""Round formation logic (``peers.rounds.rounds.Matchmaker``) with pushed joins and lists, on an
in-memory DHT.

Pure logic: the real-peer path (hivemind DHT, libp2p pushes) is covered by the integration tests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest

from peers.dht.node import dht_time
from peers.rounds.round_errors import MemberGone, RoundLate, RoundTimeout
from peers.rounds.rounds import Matchmaker, Pushes


@dataclass
class _Item:
    value: Any
    expiration_time: float


class FakeDHT:
    """``store``/``get`` with subkeys, as the matchmaker uses hivemind's DHT; counts the reads."""

    def __init__(self) -> None:
        self.data: dict[str, dict[str, _Item]] = {}
        self.gets: list[str] = []

    def store(self, key: str, value: bytes, expiration: float, *, subkey: str, return_future: bool) -> Future:
        self.data.setdefault(key, {})[subkey] = _Item(value, expiration)
        fut: Future = Future()
        fut.set_result(True)
        return fut

    def get(self, key: str, *, latest: bool, return_future: bool) -> Future:
        self.gets.append(key)
        fut: Future = Future()
        fut.set_result(_Item(dict(self.data.get(key, {})), dht_time() + 60) if key in self.data else None)
        return fut


def _matchmaker(
    dht: FakeDHT,
    me: str,
    expected: int,
    script: list[tuple[dict, frozenset]],
    connected: Callable[[], set[str] | None] = lambda: None,
) -> tuple:
    calls: dict[str, list] = {"inbox": [], "push": [], "push_join": []}

    def inbox(kind: str, r: int, wait_s: float, n_joins: int) -> tuple[dict, frozenset]:
        calls["inbox"].append((wait_s, n_joins))
        return script.pop(0) if script else ({}, frozenset())

    pushes = Pushes(
        inbox,
        lambda kind, r, members, value: calls["push"].append(members),
        lambda kind, r, peer: calls["push_join"].append(peer),
        connected,
    )
    mm = Matchmaker(dht, me, "run", pushes, min_peers=1, expected_peers=expected, join_window=30.0, poll=0.01)
    return mm, calls


def test_leader_closes_on_pushed_joins_after_one_read_of_the_records() -> None:
    dht = FakeDHT()
    script = [({}, frozenset()), ({}, frozenset({"B"})), ({}, frozenset({"B", "C"}))]
    mm, calls = _matchmaker(dht, "A", 3, script)
    group = mm.form_group("reduce", 0, deadline=_in(10))
    assert group.members == ("A", "B", "C") and group.leader == "A" and group.index == 0
    # the join records and the group key once, side by side at arrival; woken by pushes after that
    assert dht.gets == ["run.reduce.0.join", "run.reduce.0.group"]
    assert calls["push"] == [("A", "B", "C")]
    assert calls["push_join"] == []  # no earlier group: nobody to push a join to
    # the published record stays the fallback for a member whose push was lost
    stored = dht.data["run.reduce.0.group"]["A"].value
    assert msgpack.unpackb(stored) == ["A", "B", "C"]
    assert mm.last_members == ("A", "B", "C")


def test_a_joiner_pushes_its_join_to_the_last_groups_smallest_member() -> None:
    dht = FakeDHT()
    listed = bytes(msgpack.packb(["A", "B"]))
    mm, calls = _matchmaker(dht, "B", 2, [({}, frozenset()), ({"A": listed}, frozenset())])
    mm.last_members = ("A", "B")
    dht.store("run.reduce.4.join", b"1", dht_time() + 60, subkey="A", return_future=True)
    group = mm.form_group("reduce", 4, deadline=_in(10))
    assert calls["push_join"] == ["A"]
    assert group.leader == "A" and group.members == ("A", "B") and group.index == 1
    assert calls["push"] == []  # a member never publishes
    assert "B" in dht.data["run.reduce.4.join"]  # its record is written too (the fallback)


def test_the_last_leader_pushes_no_join() -> None:
    dht = FakeDHT()
    mm, calls = _matchmaker(dht, "A", 2, [({}, frozenset({"B"}))])
    mm.last_members = ("A", "B")
    assert mm.form_group("reduce", 1, deadline=_in(10)).members == ("A", "B")
    assert calls["push_join"] == []


def test_a_smaller_joiner_in_the_records_keeps_a_peer_from_leading_on_pushed_joins() -> None:
    """B gets C's pushed join, but the records show A: B must not close a round of its own."""
    dht = FakeDHT()
    dht.store("run.reduce.0.join", b"1", dht_time() + 60, subkey="A", return_future=True)
    listed = bytes(msgpack.packb(["A", "B", "C"]))
    script = [({}, frozenset({"C"})), ({}, frozenset({"C"})), ({"A": listed}, frozenset({"C"}))]
    mm, calls = _matchmaker(dht, "B", 2, script)
    group = mm.form_group("reduce", 0, deadline=_in(10))
    assert group.leader == "A" and calls["push"] == []


def test_a_smallest_newcomer_after_the_round_formed_is_late_not_a_second_leader() -> None:
    """A has the smallest ID but arrives after B closed round 5 with B and C: A must see B's list and
    be late (before this check it led a phantom round with B and C, who had moved on)."""
    dht = FakeDHT()
    for peer in ("B", "C"):
        dht.store("run.reduce.5.join", b"1", dht_time() + 60, subkey=peer, return_future=True)
    dht.store(
        "run.reduce.5.group",
        bytes(msgpack.packb(["B", "C"])),
        dht_time() + 60,
        subkey="B",
        return_future=True,
    )
    mm, calls = _matchmaker(dht, "A", 3, [])
    with pytest.raises(RoundLate):
        mm.form_group("reduce", 5, deadline=_in(10))
    assert calls["push"] == []


def test_a_round_formed_while_a_smallest_peer_waits_is_seen_at_its_next_poll() -> None:
    """The list appears after A's first reads; A (no pushes arriving) re-reads both keys each poll."""
    dht = FakeDHT()

    def inbox(kind: str, r: int, wait_s: float, n_joins: int) -> tuple[dict, frozenset]:
        if len(dht.gets) >= 4:  # after two polls B publishes a list without A
            dht.store(
                "run.reduce.0.group",
                bytes(msgpack.packb(["B"])),
                dht_time() + 60,
                subkey="B",
                return_future=True,
            )
        return {}, frozenset()

    pushes = Pushes(inbox, lambda *a: None, lambda *a: None)
    mm = Matchmaker(dht, "A", "run", pushes, min_peers=1, expected_peers=None, join_window=30.0, poll=0.01)
    with pytest.raises(RoundLate):
        mm.form_group("reduce", 0, deadline=_in(10))


def test_a_joiner_seen_only_in_the_records_is_led_and_gets_the_list_by_push_and_record() -> None:
    """B's join push went elsewhere: its DHT record is enough for leader A to close with it."""
    dht = FakeDHT()
    dht.store("run.reduce.0.join", b"1", dht_time() + 60, subkey="B", return_future=True)
    mm, calls = _matchmaker(dht, "A", 2, [])
    group = mm.form_group("reduce", 0, deadline=_in(10))
    assert group.members == ("A", "B")
    assert calls["push"] == [("A", "B")]
    assert msgpack.unpackb(dht.data["run.reduce.0.group"]["A"].value) == ["A", "B"]


def _in(seconds: float) -> float:
    import time

    return time.monotonic() + seconds


def _waiting_for_a(connected: Callable[[], set[str] | None], last: tuple[str, ...]) -> Matchmaker:
    """B, with A's join in the records and no list ever coming: A is the leader B waits for."""
    dht = FakeDHT()
    dht.store("run.reduce.2.join", b"1", dht_time() + 60, subkey="A", return_future=True)
    mm, _ = _matchmaker(dht, "B", 3, [], connected)
    mm.last_members = last
    return mm


def test_a_leader_from_the_last_group_that_disconnected_fails_the_wait_at_once() -> None:
    mm = _waiting_for_a(lambda: {"C"}, ("A", "B", "C"))
    t0 = time.monotonic()
    with pytest.raises(MemberGone, match="leader A"):
        mm.form_group("reduce", 2, deadline=_in(30))
    assert time.monotonic() - t0 < 10  # not the 30 s deadline


def test_a_leader_seen_connected_then_gone_fails_the_wait() -> None:
    answers = iter([{"A"}, {"A"}])
    mm = _waiting_for_a(lambda: next(answers, set()), ())
    with pytest.raises(MemberGone):
        mm.form_group("reduce", 2, deadline=_in(30))


def test_a_leader_never_connected_to_is_waited_for_until_the_deadline() -> None:
    """No evidence that A was ever up here (a first round, not dialled yet): no early failure within
    A's join window (30 s here)."""
    mm = _waiting_for_a(set, ())
    with pytest.raises(RoundTimeout):
        mm.form_group("reduce", 2, deadline=_in(3))
    mm = _waiting_for_a(lambda: None, ("A", "B"))  # connections unknown: no early failure either
    with pytest.raises(RoundTimeout):
        mm.form_group("reduce", 2, deadline=_in(3))


def test_a_leader_never_connected_to_is_gone_after_its_join_window() -> None:
    """A restarted B knows no last group; the leader A it waits for joined the round and died before
    B's first check. A live A would have closed the round and pushed its list within its join window
    (1 s here): B fails the wait then, not at the 30 s deadline (a restarted peer's deadline is the
    hand-set ceiling, and the survivors moved on round after round without it: simulate --chaos)."""
    mm = _waiting_for_a(lambda: {"C"}, ())
    mm.join_window = 1.0
    t0 = time.monotonic()
    with pytest.raises(MemberGone, match="leader A"):
        mm.form_group("reduce", 2, deadline=_in(30))
    assert time.monotonic() - t0 < 20  # not the 30 s deadline


def test_a_leader_never_connected_to_without_enough_joiners_is_waited_for() -> None:
    """With fewer joiners than min_peers a live leader keeps waiting: no early failure."""
    mm = _waiting_for_a(set, ())
    mm.join_window, mm.min_peers = 0.1, 3
    with pytest.raises(RoundTimeout):
        mm.form_group("reduce", 2, deadline=_in(6))


class _LateRecordDHT(FakeDHT):
    """A's join record shows up only after the first read of the join key (a slow store)."""

    def get(self, key: str, *, latest: bool, return_future: bool) -> Future:
        if key.endswith(".join") and any(g == key for g in self.gets):
            self.data.setdefault(key, {}).setdefault("A", _Item(b"1", dht_time() + 60))
        return super().get(key, latest=latest, return_future=return_future)


def test_the_leader_check_rereads_the_joins_so_a_leader_seen_late_is_the_one_watched() -> None:
    """C first sees only B's join, so it waits for B's list; the real leader A (gone since the last
    group) shows in the records later. Each check re-reads the joins: C notices A is gone instead of
    watching the live B until the deadline (seen with a leader killed as it closed the round)."""
    dht = _LateRecordDHT()
    dht.store("run.reduce.2.join", b"1", dht_time() + 60, subkey="B", return_future=True)
    mm, _ = _matchmaker(dht, "C", 3, [], lambda: {"B"})
    mm.last_members = ("A", "B", "C")
    t0 = time.monotonic()
    with pytest.raises(MemberGone, match="leader A"):
        mm.form_group("reduce", 2, deadline=_in(30))
    assert time.monotonic() - t0 < 10  # not the 30 s deadline


def test_a_member_of_the_last_group_that_has_gone_is_neither_pushed_to_nor_waited_for() -> None:
    """A (the last leader) has no connection any more: B pushes its join to no one (it is now the
    smallest live member) and closes as soon as C joins, not after the 30 s join window."""
    dht = FakeDHT()
    dht.store("run.reduce.2.join", b"1", dht_time() + 60, subkey="C", return_future=True)
    mm, calls = _matchmaker(dht, "B", 3, [], lambda: {"C"})
    mm.last_members = ("A", "B", "C")
    t0 = time.monotonic()
    group = mm.form_group("reduce", 2, deadline=_in(60))
    assert group.members == ("B", "C") and calls["push_join"] == []
    assert time.monotonic() - t0 < 10
