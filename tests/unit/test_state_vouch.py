"""Which donors' states enough other donors vouch for (``peers.state.donors.vouched``), and the
announcement's vouch list on the wire. The real-peer case (an admitted forger) is in
``tests/integration/test_state_transfer.py``."""

from __future__ import annotations

import msgpack
import pytest

from peers.state.donors import MAX_VOUCHES, parse_announcement, vouched
from swarmtrain.core.errors import ProtocolError

D, E = b"\x01" * 32, b"\x02" * 32  # the honest digest, a forged one


def _pick(found: list[tuple[int, str]], vouches: dict[str, set[tuple[int, bytes]]], k: int = 2) -> list[str]:
    anns = [(r, p, b"h" * 32, 10) for r, p in found]
    errors: list[str] = []
    return [a[1] for a, _ in vouched(anns, {p: frozenset(v) for p, v in vouches.items()}, k, errors)]


def test_a_lone_forger_is_not_vouched_for_but_honest_donors_are() -> None:
    vouches = {"a": {(5, D)}, "b": {(5, D)}, "f": {(6, E)}}
    assert _pick([(6, "f"), (5, "a"), (5, "b")], vouches) == ["a", "b"]
    assert _pick([(6, "f"), (5, "a"), (5, "b")], vouches, k=1) == ["f", "a", "b"]  # the old rule


def test_a_single_donor_stands_alone_and_an_unvouched_state_needs_company() -> None:
    assert _pick([(3, "a")], {"a": set()}) == ["a"]  # the run has only one donor
    # two donors, one of them serving a state it downloaded rather than committed
    assert _pick([(5, "a"), (5, "b")], {"a": {(5, D)}, "b": set()}) == []


def test_a_donor_one_round_ahead_vouches_for_the_others_state() -> None:
    """A committed round 6 just now, B not yet: B's round 5 has two vouchers (A remembers round 5),
    A's round 6 has one until B commits it too."""
    vouches = {"a": {(5, D), (6, E)}, "b": {(5, D)}}
    assert _pick([(6, "a"), (5, "b")], vouches) == ["b"]


def test_a_forger_claiming_the_honest_digest_is_vouched_for_and_left_to_the_state_check() -> None:
    anns = [(5, "f", b"h" * 32, 10), (5, "a", b"h" * 32, 10)]
    out = vouched(anns, {"f": frozenset({(5, D)}), "a": frozenset({(5, D)})}, 2, [])
    assert [(a[1], d) for a, d in out] == [("f", D), ("a", D)]  # the caller's check compares the digest


def _ann(vouch: object) -> bytes:
    return msgpack.packb({"hash": b"h" * 32, "nbytes": 9, "round": 4, "vouch": vouch}, use_bin_type=True)


def test_the_vouch_list_is_bounded_and_typed() -> None:
    assert parse_announcement(_ann([[4, D], [3, E]]))[3] == frozenset({(4, D), (3, E)})
    legacy = msgpack.packb({"hash": b"h" * 32, "nbytes": 9, "round": 4}, use_bin_type=True)
    assert parse_announcement(legacy)[3] == frozenset()
    for bad in ([[4, D]] * (MAX_VOUCHES + 1), [[4, b"x"]], [[-1, D]], [4, D], "x", [[4, D, 1]]):
        with pytest.raises(ProtocolError):
            parse_announcement(_ann(bad))


def test_colluders_fewer_than_the_honest_donors_of_a_round_plant_nothing_in_it() -> None:
    """Issue 30.1: two admitted colluders vouch for each other's digest of round 5, three honest donors
    for the honest one: only the honest state counts (before, both did); with as many colluders as
    honest donors, neither does (the newcomer falls back to an older round they agree on)."""
    honest = {p: {(4, E), (5, D)} for p in "abc"}
    anns = [(5, "x"), (5, "y"), (5, "a"), (5, "b"), (5, "c")]
    assert _pick(anns, {**honest, "x": {(5, E)}, "y": {(5, E)}}) == ["a", "b", "c"]
    tie = {"a": {(4, E), (5, D)}, "b": {(4, E), (5, D)}, "x": {(4, E), (5, E)}, "y": {(4, E), (5, E)}}
    assert _pick([(5, "x"), (5, "y"), (5, "a"), (5, "b")], tie) == []
    assert _pick([(4, "a"), (4, "x")], tie) == ["a", "x"]  # the round all four committed alike
