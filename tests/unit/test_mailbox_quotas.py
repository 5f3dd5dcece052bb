"""``peers.wire.mailbox`` quotas: bytes and entries per sender and in all, members only once the group is
known, the pre-group allowance before it, the current and next round only, and the round budgets
``peers.rounds.collective`` derives from the model."""

from __future__ import annotations

import pytest

from peers.wire.mailbox import (
    CONTROL_RESERVE,
    Delivery,
    Mailbox,
    Quota,
    Refused,
    RoundBudget,
    gather_budget,
    packet_bound,
    reduce_budget,
)
from peers.wire.messages import Envelope

A, B, Z = "A", "B", "Z"  # two members and an outsider
BUDGET = RoundBudget(Quota(1000, 4), 400)


def _env(typ: str = "part", rnd: int = 0, chunk: int = 0, nbytes: int = 0, kind: str = "reduce") -> Envelope:
    return Envelope(
        type=typ, run="r", kind=kind, round=rnd, chunk=chunk, frames=1 if nbytes else 0, nbytes=nbytes
    )


def _store(mb: Mailbox, sender: str, env: Envelope) -> None:
    t = mb.reserve(sender, env)
    assert t is not None
    mb.commit(t, Delivery(sender, env, (b"x" * env.nbytes,) if env.nbytes else ()))


def test_zero_byte_messages_cost_entries_per_sender_and_in_all() -> None:
    mb = Mailbox(pre_group=Quota(1 << 20, 5), pre_group_total=Quota(1 << 20, 7))
    for c in range(5):
        _store(mb, Z, _env(chunk=c))
    assert mb.reserve(Z, _env(chunk=99)) is None  # the sender's entries are used up: wait for the group
    assert mb.buffered_entries == 5 and mb.buffered_bytes == 0
    _store(mb, A, _env(chunk=0))
    _store(mb, A, _env(chunk=1))
    assert mb.reserve(A, _env(chunk=2)) is None  # the total pre-group entries are used up
    # control messages keep their own reserve on top: a member's join still gets in
    t = mb.reserve(A, _env("join"))
    assert t is not None
    mb.release(t)
    assert mb.buffered_entries == 7


def test_pre_group_bytes_per_sender_and_in_all() -> None:
    mb = Mailbox(pre_group=Quota(1000, 100), pre_group_total=Quota(1500, 100))
    _store(mb, Z, _env(nbytes=1000))
    assert mb.reserve(Z, _env(chunk=1, nbytes=1)) is None
    assert mb.reserve(A, _env(nbytes=600)) is None  # 1000 + 600 > 1500 in all
    _store(mb, A, _env(nbytes=500))
    assert mb.buffered_bytes == 1500
    # a pushed list needs room even when the data allowance is full
    big = CONTROL_RESERVE.nbytes // 2
    t = mb.reserve(A, _env("grp", nbytes=big))
    assert t is not None
    mb.release(t)


def test_group_known_drops_non_members_and_refuses_more() -> None:
    mb = Mailbox()
    _store(mb, Z, _env(nbytes=300))
    _store(mb, A, _env(nbytes=200))
    t_z = mb.reserve(Z, _env(chunk=1, nbytes=100))  # an outsider's message in flight
    assert t_z is not None
    assert mb.set_group("reduce", 0, [A, B], BUDGET) == 400  # stored 300 + reserved 100
    assert mb.dropped_bytes == 400
    assert [k[1] for k in mb.snapshot("reduce", 0)] == [A]
    assert mb.buffered_bytes == 200
    with pytest.raises(Refused) as e:
        mb.commit(t_z, Delivery(Z, _env(chunk=1, nbytes=100), (b"x" * 100,)))
    assert not e.value.keep_stream
    with pytest.raises(Refused) as e:
        mb.reserve(Z, _env(chunk=2))
    assert "not a member" in str(e.value) and not e.value.keep_stream


def test_member_quota_bytes_entries_and_message_cap() -> None:
    mb = Mailbox()
    mb.set_group("reduce", 0, [A, B], BUDGET)
    with pytest.raises(Refused, match="exceeds"):
        mb.reserve(A, _env(nbytes=401))
    _store(mb, A, _env(chunk=0, nbytes=400))
    _store(mb, A, _env(chunk=1, nbytes=400))
    with pytest.raises(Refused, match="quota"):
        mb.reserve(A, _env(chunk=2, nbytes=201))  # 800 + 201 > 1000 bytes
    _store(mb, A, _env(chunk=2))
    _store(mb, A, _env(chunk=3))
    with pytest.raises(Refused, match="quota"):
        mb.reserve(A, _env(chunk=4))  # a fifth entry, even of zero bytes
    _store(mb, B, _env(chunk=0, nbytes=400))  # the other member has its own quota
    assert mb.buffered_bytes == 1200 and mb.buffered_entries == 5


def test_global_ceiling() -> None:
    mb = Mailbox(max_bytes=500, max_entries=3)
    mb.set_group("reduce", 0, [A, B], BUDGET)
    _store(mb, A, _env(nbytes=400))
    with pytest.raises(Refused, match="buffer full"):
        mb.reserve(B, _env(nbytes=101))
    _store(mb, B, _env(nbytes=100))
    _store(mb, B, _env(chunk=1))
    with pytest.raises(Refused, match="buffer full"):
        mb.reserve(B, _env(chunk=2))


def test_only_current_and_next_round_and_floor_purges() -> None:
    mb = Mailbox()
    mb.set_floor(5)
    with pytest.raises(Refused) as e:
        mb.reserve(A, _env(rnd=4))
    assert e.value.keep_stream  # a late honest message: drained, the stream goes on
    with pytest.raises(Refused):
        mb.reserve(A, _env(rnd=7))
    _store(mb, A, _env(rnd=5, nbytes=10))
    _store(mb, A, _env(rnd=6, nbytes=20))
    t = mb.reserve(A, _env(rnd=6, chunk=1, nbytes=5))
    assert t is not None and mb.buffered_bytes == 35
    mb.set_floor(6)
    assert mb.buffered_bytes == 25 and mb.snapshot("reduce", 5) == {}
    mb.set_floor(7)
    assert mb.buffered_bytes == 0 and mb.buffered_entries == 0
    with pytest.raises(Refused, match="round is over"):
        mb.commit(t, Delivery(A, _env(rnd=6, chunk=1, nbytes=5), (b"12345",)))


def test_duplicates_and_release_give_room_back() -> None:
    mb = Mailbox(pre_group=Quota(100, 2), pre_group_total=Quota(100, 2))
    t = mb.reserve(A, _env(nbytes=100))
    assert t is not None
    with pytest.raises(Refused, match="duplicate") as e:
        mb.reserve(A, _env(nbytes=100))  # same key while the first is in flight
    assert e.value.keep_stream
    assert mb.reserve(A, _env(chunk=1, nbytes=1)) is None
    mb.release(t)  # its body never came
    assert mb.buffered_bytes == 0
    _store(mb, A, _env(chunk=1, nbytes=100))


def test_listener_is_called_when_room_may_appear() -> None:
    mb = Mailbox()
    calls: list[int] = []
    mb.add_listener(lambda: calls.append(1))
    mb.set_group("reduce", 0, [A], BUDGET)
    mb.set_floor(1)
    assert len(calls) == 2


def test_chunks_pipeline_a_partition_within_their_floor_and_ceiling() -> None:
    from peers.wire.mailbox import MIN_CHUNK, PIPELINE_CHUNKS, chunk_step

    assert chunk_step(4_000_000, 4, 1 << 20) == 250_000  # 4 chunks of the 1M partition
    assert chunk_step(4_000_001, 4, 1 << 20) == 250_001  # the largest partition, rounded up
    assert chunk_step(4_000_000, 4, 50_000) == 50_000  # never above chunk_elems
    assert chunk_step(100_000, 4, 1 << 20) == MIN_CHUNK  # never below the floor...
    assert chunk_step(40_000, 4, 1 << 20) == 10_000  # ...unless the partition itself is smaller
    assert chunk_step(10, 1, 4) == 4 and chunk_step(0, 3, 1 << 20) == 1
    for numel, n in [(842_496, 3), (16 << 20, 4), (1_234_567, 5)]:
        part = -(-numel // n)
        assert -(-part // chunk_step(numel, n, 1 << 20)) == PIPELINE_CHUNKS


def test_round_budgets_follow_the_model_and_the_group() -> None:
    from compression import Int8Compressor, NoneCompressor

    none, int8 = NoneCompressor(), Int8Compressor()
    b = reduce_budget(4_000_000, 4, 1 << 20, none)
    # 1M elements per partition: 4 chunks of 250K (1 MB); parts, aggregates and verifier parts
    assert b.message_bytes == packet_bound(none, 250_000) < 1_010_000
    assert 3 * 4_000_000 < b.per_sender.nbytes < 3 * 4_000_000 + 300_000
    assert b.per_sender.entries == 4 * 4 + 16
    small = reduce_budget(4_000_000, 4, 1 << 20, int8)
    assert small.message_bytes < b.message_bytes / 3
    more = reduce_budget(4_000_000, 8, 1 << 18, none)
    assert more.per_sender.nbytes < b.per_sender.nbytes and more.per_sender.entries == 4 * 4 + 16
    one = reduce_budget(4_000_000, 4, 100_000, none)  # chunk_elems is the ceiling: 10 chunks
    assert one.message_bytes == packet_bound(none, 100_000) and one.per_sender.entries == 4 * 10 + 16
    g = gather_budget(1 << 20)
    assert g.message_bytes == 1 << 20 and g.per_sender.entries == 16
