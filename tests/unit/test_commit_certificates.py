"""Commit certificates (issue 30.1): signed records of a round's state and the quorum a newcomer asks
of them (``peers.state.certificates``). The real-peer case (two admitted colluders) is in
``tests/integration/test_certified_state.py``."""

from __future__ import annotations

import msgpack
import pytest

from peers.keys.signing import Signer
from peers.state.certificates import (
    MAX_CERTIFICATES,
    Certificate,
    certified,
    decode_record,
    encode_record,
    sign_certificate,
)
from peers.state.donors import by_certificate
from swarmtrain.core.errors import ProtocolError

RUN = "t-cert"
D, E = b"\x01" * 32, b"\x02" * 32  # the honest digest, a forged one


@pytest.fixture(scope="module")
def signers(tmp_path_factory: pytest.TempPathFactory) -> list[Signer]:
    from peers.keys.identity import ensure_identity

    out = []
    for i in range(3):
        path = tmp_path_factory.mktemp("id") / f"id{i}.key"
        ensure_identity(path)
        out.append(Signer(path))
    return out


def _record(s: Signer, *certs: tuple[int, bytes, int], run: str = RUN) -> bytes:
    return encode_record(s, [sign_certificate(s, run, r, d, n) for r, d, n in certs])


def test_a_signed_record_reads_back_as_its_certificates(signers: list[Signer]) -> None:
    a = signers[0]
    got = decode_record(RUN, a.peer_id, _record(a, (5, D, 4), (6, E, 3)))
    assert got == [Certificate(a.peer_id, 5, D, 4), Certificate(a.peer_id, 6, E, 3)]


def test_a_forged_signature_or_a_changed_certificate_is_refused(signers: list[Signer]) -> None:
    a, b = signers[0], signers[1]
    # b's key signs a record that claims to be a's: the key does not hash to a's peer ID
    fake = msgpack.packb(
        {"p": a.peer_id, "k": b.public_der, "c": [sign_certificate(b, RUN, 5, D, 4)]}, use_bin_type=True
    )
    with pytest.raises(ProtocolError, match="not the key of the claimed peer ID"):
        decode_record(RUN, a.peer_id, fake)
    # a's own certificate with another digest written into the signed body
    body, sig = sign_certificate(a, RUN, 5, D, 4)
    changed = [body.replace(D, E), sig]
    value = msgpack.packb({"p": a.peer_id, "k": a.public_der, "c": [changed]}, use_bin_type=True)
    with pytest.raises(ProtocolError, match="invalid signature"):
        decode_record(RUN, a.peer_id, value)
    with pytest.raises(ProtocolError, match="another peer's subkey"):  # stored under b's subkey
        decode_record(RUN, b.peer_id, _record(a, (5, D, 4)))
    with pytest.raises(ProtocolError, match="another run"):  # a certificate of another run replayed
        decode_record(RUN, a.peer_id, _record(a, (5, D, 4), run="other-run"))


@pytest.mark.parametrize(
    "bad",
    [b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"p": 1, "k": b"", "c": []}), b"x" * 9000],
)
def test_a_malformed_record_raises_only_protocol_error(signers: list[Signer], bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_record(RUN, signers[0].peer_id, bad)


def test_a_certificate_out_of_range_is_not_signed(signers: list[Signer]) -> None:
    for rnd, d, n in ((1 << 41, D, 4), (5, b"x", 4), (5, D, 0)):
        with pytest.raises(ProtocolError):
            sign_certificate(signers[0], RUN, rnd, d, n)


def _c(signer: str, rnd: int, d: bytes, n: int) -> Certificate:
    return Certificate(signer, rnd, d, n)


def test_more_than_half_of_the_group_certifies_a_state() -> None:
    certs = [_c(p, 5, D, 5) for p in "abc"]
    got = certified(certs)
    assert got[5].digest == D and got[5].signers == frozenset("abc") and got[5].group_size == 5


def test_too_few_signers_are_refused() -> None:
    errors: list[str] = []
    assert certified([_c(p, 5, D, 5) for p in "ab"], errors=errors) == {}
    assert "2 of a group of 5" in errors[0]


def test_a_certificate_of_another_digest_counts_for_nothing_toward_this_one() -> None:
    # three signed the round, but one of them another digest: two of five for D, one for E
    assert certified([_c("a", 5, D, 5), _c("b", 5, D, 5), _c("c", 5, E, 5)]) == {}


def test_a_duplicate_signer_counts_once() -> None:
    assert certified([_c("a", 5, D, 3)] * MAX_CERTIFICATES) == {}
    assert certified([_c("a", 5, D, 3)] * 2 + [_c("b", 5, D, 3)])[5].signers == frozenset("ab")


def test_a_signer_of_two_states_of_one_round_counts_for_neither() -> None:
    certs = [_c("a", 5, D, 3), _c("a", 5, E, 3), _c("b", 5, D, 3)]  # a equivocates: 1 of 3 left
    errors: list[str] = []
    assert certified(certs, errors=errors) == {}
    assert "signed two states" in errors[0]


def test_signers_claiming_a_smaller_group_do_not_shrink_the_quorum() -> None:
    """Two colluders of a round of six sign a forged state and claim a group of two: the round's
    group is the largest one its signers claim, so they are two of six."""
    honest = [_c(p, 5, D, 6) for p in "abcd"]
    forged = [_c(p, 5, E, 2) for p in "xy"]
    got = certified(honest + forged)
    assert got[5].digest == D
    assert certified(forged + [_c(p, 5, D, 6) for p in "ab"]) == {}  # nobody has a quorum of six


def test_one_signer_claiming_a_huge_group_does_not_stall_the_round() -> None:
    """A colluder among a round's signers claims a group of 65536: the lower median of the claims is
    the honest size (with the largest claim counted, no state would ever be certified again)."""
    certs = [_c(p, 5, D, 4) for p in "abc"] + [_c("x", 5, D, 1 << 16)]
    assert certified(certs)[5].group_size == 4
    alone = [_c(p, 5, D, 4) for p in "abc"] + [_c("x", 5, E, 1 << 16)]  # or on a state of its own
    assert certified(alone)[5].digest == D


def test_the_group_is_at_least_everyone_who_signed_the_round() -> None:
    """Every member of a round, honest or not, says it was in it: four signers of a round, whatever
    sizes they claim, make a group of at least four."""
    certs = [_c(p, 5, D, 2) for p in "ab"] + [_c(p, 5, E, 2) for p in "xy"]
    errors: list[str] = []
    assert certified(certs, errors=errors) == {}
    assert "2 of a group of 4" in errors[0]


def test_unadmitted_signers_count_for_nothing() -> None:
    certs = [_c(p, 5, D, 3) for p in "axy"]
    assert certified(certs, admitted=lambda p: p == "a") == {}
    assert certified(certs, admitted=lambda p: p != "y")[5].signers == frozenset("ax")


def test_colluders_cannot_certify_a_round_of_their_own_ahead_of_the_others() -> None:
    """Issue 30 finding 1: two admitted colluders announce a round ahead and sign it as a group of
    two (a quorum of their own group). They are two of the five established live peers."""
    honest = [_c(p, 5, D, 5) for p in "abcxy"]  # the colluders x, y took part in round 5
    ahead = [_c(p, 6, E, 2) for p in "xy"]
    errors: list[str] = []
    got = certified(honest + ahead, live=frozenset("abcxy"), errors=errors)
    assert set(got) == {5} and got[5].digest == D
    assert any("round 6: 2 of the 5 established peers signed" in e for e in errors)
    # the control: seen without the others' history, their round is a quorum of its own group
    assert certified(ahead, live=frozenset("abcxy"))[6].digest == E


def test_established_peers_that_left_do_not_hold_the_history_back() -> None:
    """Round 5 was signed by five; three of them left. The two that stay commit round 6 as a group of
    two: two of the two live established peers."""
    certs = [_c(p, 5, D, 5) for p in "abcde"] + [_c(p, 6, E, 2) for p in "ab"]
    assert certified(certs, live=frozenset("ab"))[6].digest == E
    assert 6 not in certified(certs, live=frozenset("abcde"))  # had they stayed, two of five


def test_half_of_the_established_peers_committing_a_round_ahead_is_taken() -> None:
    """The preemption hand-off (``tests/integration/test_preemption_handoff.py``): a and b commit
    round 6 while c and d are frozen, then leave and hand it over; c and d must take it. Two of the
    four established peers: as many as two colluders of four, which is why half is enough."""
    certs = [_c(p, 5, D, 4) for p in "abcd"] + [_c(p, 6, E, 2) for p in "ab"]
    assert certified(certs, live=frozenset("abcd"))[6].digest == E
    assert certified(certs, live=frozenset("abcd"), claimed=frozenset("abcd"))[6].digest == E
    assert 6 not in certified(certs + [_c("e", 5, D, 5)], live=frozenset("abcde"))  # two of five


def test_only_announcements_of_a_certified_round_are_taken_with_its_digest() -> None:
    certs = [_c(p, 5, D, 3) for p in "abc"] + [_c(p, 6, E, 2) for p in "xy"]
    states = certified(certs, live=frozenset("abcxy"))
    found = [(6, "x", b"h" * 32, 10), (5, "a", b"h" * 32, 10), (5, "x", b"h" * 32, 10)]
    errors: list[str] = []
    out = by_certificate(found, states, errors)
    assert [(a[1], d) for a, d in out] == [("a", D), ("x", D)]  # x's round-5 bytes face the digest check
    assert "round 6 has no certified state" in errors[0]


def test_colluders_that_signed_none_of_the_previous_round_are_refused_whatever_was_read() -> None:
    """Issue 30, seen under load at 60 steps: round 1 had three members (the fourth restarting), one
    of their records was not read, so two colluders signing round 2 as a group of two were two of
    the four established peers read: half, enough for the history bound. None of them signed round
    1, whose live signers are the chain their round must carry on."""
    certs = [_c(p, 1, D, 3) for p in "ab"] + [_c(p, 2, E, 2) for p in "xy"]  # c's record was not read
    errors: list[str] = []
    got = certified(certs, live=frozenset("abcxy"), errors=errors)
    assert set(got) == {1}
    assert any("round 2: 0 of the 2 live signers of round 1 signed" in e for e in errors), errors
    # the control: had they signed round 1 too (they know its digest), two of its four signers read
    # carry the chain: c's missing record is what lets it through, the residual the threat model states
    carry = certs + [_c(p, 1, D, 3) for p in "xy"]
    assert certified(carry, live=frozenset("abcxy"))[2].digest == E
    assert 2 not in certified(carry + [_c("c", 1, D, 3)], live=frozenset("abcxy"))  # c read: 2 of 5


def test_a_group_that_shrinks_by_half_carries_its_rounds_on() -> None:
    """Half of round 5's live signers sign round 6 (the others preempted or late): taken; a group of
    six that loses four at once waits until the old round's records expire."""
    certs = [_c(p, 5, D, 4) for p in "abcd"] + [_c(p, 6, E, 2) for p in "ab"] + [_c(p, 7, D, 2) for p in "ab"]
    assert set(certified(certs, live=frozenset("abcd"))) == {5, 6, 7}
    six = [_c(p, 5, D, 6) for p in "abcdef"] + [_c(p, 6, E, 2) for p in "ab"]
    assert 6 not in certified(six, live=frozenset("abcdef"))
    assert 6 in certified(six, live=frozenset("ab"))  # the four that left no longer count


def test_a_restarted_peer_reads_back_its_earlier_certificates(signers: list[Signer]) -> None:
    """``own_entries``: what this identity's earlier process stored, verified, oldest first, so a
    restarted peer's first store keeps them (its record is its history for a reader that has not yet
    read the others' certificate of its newest round). Expired, forged or absent: nothing."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from peers.dht.node import dht_time
    from peers.state.certificates import own_entries

    a, b = signers[0], signers[1]

    def node(value: object, expires: float) -> SimpleNamespace:
        found: Future[object] = Future()
        item = SimpleNamespace(value=value, expiration_time=expires)
        found.set_result(SimpleNamespace(value={a.peer_id: item}))
        return SimpleNamespace(peer_id=a.peer_id, dht=SimpleNamespace(get=lambda *_, **__: found))

    entries = [sign_certificate(a, RUN, r, D, 3) for r in (6, 4, 5)]
    got = own_entries(node(encode_record(a, entries), dht_time() + 60), RUN, 1.0)
    assert [r for r, _ in got] == [4, 5, 6]
    assert decode_record(RUN, a.peer_id, encode_record(a, [e for _, e in got]))[0].round == 4
    assert own_entries(node(encode_record(a, entries), dht_time() - 1), RUN, 1.0) == []  # expired
    forged = encode_record(b, [sign_certificate(b, RUN, 4, D, 3)])  # b's record under a's subkey
    assert own_entries(node(forged, dht_time() + 60), RUN, 1.0) == []
    assert own_entries(node(None, dht_time() + 60), RUN, 1.0) == []


def test_colluders_that_tie_the_honest_rounds_take_no_round_after_the_tie() -> None:
    """Issue 30, seen in CI under load (stop 43): two honest members a round, and two colluders that
    sign each round number ahead of them. Every honest round is a tie of two against two (no
    quorum); round 1, of four, was read as two of four (the others' records unread); so the
    colluders' round 4, a quorum of their own group, had no certified round before it to carry on.
    After a tie, a round is taken only when its live signers are most of its own and the tie's."""
    old = [_c(p, 1, D, 4) for p in "ab"]  # c's and d's records were not read
    tied = [_c(p, r, d, 2) for r in (2, 3) for p, d in (("a", D), ("b", D), ("x", E), ("y", E))]
    ahead = [_c(p, 4, E, 2) for p in "xy"]
    errors: list[str] = []
    assert certified(old + tied + ahead, live=frozenset("abcxy"), errors=errors) == {}
    assert any("round 4: 2 of the 4 live signers of it and of round 3 (a tie)" in e for e in errors), errors
    # a third honest member is back for round 4 (the colluders signed round 5 by then): three of
    # the five live signers of round 4 and of the tie; the colluders' round 5 carries none of them
    back = [_c(p, 4, D, 3) for p in "abc"] + [_c(p, 5, E, 2) for p in "xy"]
    assert set(certified(old + tied + back, live=frozenset("abcxy"))) == {4}
    # without the tie (the colluders never signed rounds 2 and 3), rounds 2 and 3 carry the chain
    honest = [_c(p, r, D, 2) for r in (2, 3) for p in "ab"]
    assert set(certified(old + honest + ahead, live=frozenset("abcxy"))) == {2, 3}


def test_the_chain_breaks_a_tie_for_the_members_that_carry_the_history_on() -> None:
    """Seen with real peers under load: rounds 3 and 4 had two honest members each, and the two
    colluders signed their own state of those round numbers: ties, so the two honest peers that
    needed a state (one restarted, one late) found nothing certified above round 2 and waited for
    good. The honest side carries the chain from round 2 (two of its three signers), the colluders
    none of it: the tie is the honest side's; the colluders' round 5 carries none of round 4."""
    history = [_c(p, 1, D, 4) for p in "abcd"] + [_c(p, 2, D, 3) for p in "abc"]
    tied = [_c(p, r, d, 2) for r in (3, 4) for p, d in (("a", D), ("b", D), ("x", E), ("y", E))]
    ahead = [_c(p, 5, E, 2) for p in "xy"]
    got = certified(history + tied + ahead, live=frozenset("abcdxy"))
    assert set(got) == {1, 2, 3, 4} and got[4].digest == D and got[4].signers == frozenset("ab")
    # colluders that also signed the honest state of round 2 carry as much of it: the tie stays,
    # and their round ahead is refused by the rule after a tie (a stall, not a plant)
    also = [_c(p, 2, D, 5) for p in "xy"]
    got = certified(history + also + tied + ahead, live=frozenset("abcdxy"))
    assert set(got) == {1, 2}


def test_colluders_win_no_tie_or_skipped_round_with_a_full_read() -> None:
    """Found by review of the tie-break (2026-12-06), both with every record read and everyone live.
    A tie at round 2 whose colluders carry as many of round 1's signers as the honest side plus one
    (they co-signed its honest digest) must need more than half of them; and the colluders' round 11,
    which the honest peers skipped, must face every established peer, not those established by
    then (x and y were half of round 10; c and d first signed round 12)."""
    live = frozenset("abcdxy")
    cosigned = (
        [_c(p, 1, D, 2) for p in "cdxy"] + [_c(p, 2, D, 2) for p in "bd"] + [_c(p, 2, E, 2) for p in "xy"]
    )
    cosigned += [_c(p, 3, D, 4) for p in "abcd"] + [_c(p, 4, D, 2) for p in "ad"]
    got = certified(cosigned, live=live)
    assert all(q.digest == D for q in got.values()) and max(got) >= 3
    skipped = [_c(p, 10, D, 4) for p in "abxy"] + [_c(p, 11, E, 2) for p in "xy"]
    skipped += [_c(p, r, D, 4) for r in (12, 13, 14) for p in "abcd"]
    got = certified(skipped, live=live)
    assert 11 not in got and max(got) == 14


def test_a_read_that_misses_most_honest_records_plants_nothing() -> None:
    """Issue 30, the intruder Done-when run that failed in a fresh clone (2026-12-07): the newcomer
    read b's record (rounds 0-2 of a group of three, no quorum alone) and the two colluders' round 3
    (a quorum of their own group of two); a's and c's records were unread, so no round was taken
    before theirs and nothing bounded it. The live signers read of round 2, not taken, must carry
    round 3 on: none of them signed it. The peer records that were read do not matter here."""
    certs = [_c("b", r, D, 3) for r in (0, 1, 2)] + [_c(p, 3, E, 2) for p in "xy"]
    errors: list[str] = []
    assert certified(certs, live=frozenset("abcxy"), errors=errors) == {}
    assert any("round 3: 0 of the 1 live signers read of round 2 (not taken) signed" in e for e in errors)
    assert certified(certs, live=None) == {}  # no peer record read either
    # an honest round after a round only colluders signed, with the history before carried on
    # (the skipped round of the review test below) is still taken
    skipped = [_c(p, 10, D, 4) for p in "abcd"] + [_c(p, 11, E, 2) for p in "xy"]
    skipped += [_c(p, 12, D, 4) for p in "abcd"]
    assert set(certified(skipped, live=frozenset("abcdxy"), claimed=frozenset("abcd"))) == {10, 12}


def test_live_peers_that_say_they_committed_count_in_the_history_bound() -> None:
    """The same read, with the colluders co-signing round 2's honest digest (they know it): round 2
    is then a quorum of b, x and y, and the colluders carry it on (two of its three signers read).
    a and c, whose certificates were unread, say in their own live peer records that they committed
    rounds: five established peers, of whom the colluders are two. Without that claim the read's
    three signers are the whole bound, and the colluders' round is taken (the control)."""
    certs = [_c("b", r, D, 3) for r in (0, 1, 2)] + [_c(p, 2, D, 3) for p in "xy"]
    certs += [_c(p, 3, E, 2) for p in "xy"]
    live = frozenset("abcxy")
    assert certified(certs, live=live)[3].digest == E  # the control: the hole without the claim
    errors: list[str] = []
    got = certified(certs, live=live, claimed=frozenset("abc"), errors=errors)
    assert set(got) == {2} and got[2].digest == D
    assert any("round 3: 2 of the 5 established peers signed" in e for e in errors), errors
