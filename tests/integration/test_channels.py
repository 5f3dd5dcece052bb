"""Persistent channels (``peers.wire.channels``) between two real peer processes on 127.0.0.1.

Many messages to one peer travel on one stream, arrive in order and are each acknowledged; a message
the receiver refuses (a duplicate) fails alone while the stream stays usable; the byte ledgers of
both ends agree exactly (what one side counts as sent, the other counts as received); and a member
list pushed by a round leader (``peers.rounds.rounds`` step 4) is adopted only under the DHT record's rules.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from peer_helpers import PeerGroup, loopback_config, report, reporting_errors

N_MSGS = 40
PAYLOAD = 64 * 1024 + 3


def worker(rank: int, initial: list[str], q: Any, receiver_id: str) -> None:
    from peers import P2PCollective, PeerNode
    from peers.rounds import inbound
    from peers.wire.messages import Envelope
    from swarmtrain.core.errors import ProtocolError

    class Counting:
        """Counts the incoming streams: the collective's stream handler is ``Inbound.handle``."""

        streams = 0
        handle = inbound.Inbound.handle

        @staticmethod
        async def counted(self: Any, info: Any, reader: Any, writer: Any) -> None:
            Counting.streams += 1
            await Counting.handle(self, info, reader, writer)

    inbound.Inbound.handle = Counting.counted  # type: ignore[method-assign]  # this child process only

    with reporting_errors(q, rank), PeerNode(loopback_config("t-chan", initial)) as node:
        report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
        coll = P2PCollective(node)
        node.wait_for_peers(2, timeout=60)
        if rank == 0:
            from peers.wire.mailbox import Quota

            # no round forms here: room for all messages before a group is known (peers.wire.mailbox)
            coll._mailbox.set_pre_group(Quota(8 << 20, 2 * N_MSGS))
            # receiver: wait for every message, then report what arrived and the ledger
            want = N_MSGS + 1

            def ready(slot: dict[Any, Any]) -> bool:
                return len(slot) >= want

            slot = coll._mailbox.wait("t", 0, ready, time.monotonic() + 90)
            time.sleep(3.0)  # the last ack's bytes are counted right after it is written
            pushed, _ = coll._group_inbox("g", 0, 30.0, 0)  # a member list pushed by the other peer
            group = coll._matchmaker._adopt("g", 0, pushed)
            order = [k[2] for k in (slot or {})]
            sizes = sorted({d.nbytes for d in (slot or {}).values()})
            report(
                q,
                "rx",
                rank,
                {
                    "order": order,
                    "sizes": sizes,
                    "streams": Counting.streams,
                    "ledger": coll.ledger.round_bytes("t", 0),
                    "pushed_from": sorted(pushed),
                    "pushed_types": sorted({type(v).__name__ for v in pushed.values()}),
                    "group": None if group is None else [group.leader, list(group.members)],
                },
            )
            return
        base = Envelope(type="part", run=coll.run_id, kind="t", round=0, index=0, frames=1, nbytes=PAYLOAD)
        deadline = time.monotonic() + 60
        futs = [
            coll._send(
                receiver_id, Envelope(**{**base.__dict__, "chunk": i}), [os.urandom(PAYLOAD)], deadline
            )
            for i in range(N_MSGS)
        ]
        ok = [f.result(timeout=90) is None for f in futs]
        refused = ""
        try:
            dup = Envelope(**{**base.__dict__, "chunk": 0})
            coll._send(receiver_id, dup, [os.urandom(PAYLOAD)], deadline).result(timeout=90)
        except ProtocolError as e:
            refused = str(e)
        after = coll._send(
            receiver_id, Envelope(**{**base.__dict__, "chunk": N_MSGS}), [b"x" * PAYLOAD], deadline
        )
        after.result(timeout=90)
        import msgpack

        members = tuple(sorted([node.peer_id, receiver_id]))
        coll._push_group("g", 0, members, bytes(msgpack.packb(list(members))))
        time.sleep(1.0)
        report(q, "tx", rank, {"ok": ok, "refused": refused, "ledger": coll.ledger.round_bytes("t", 0)})
        time.sleep(10.0)  # stay up until the receiver reported


def test_one_stream_many_messages_refusal_keeps_the_stream_and_ledgers_agree() -> None:
    g = PeerGroup(worker, 2, args=("",))
    try:
        g.spawn(0, [])
        first = g.wait_for("ready", 0, g.startup_timeout)
        g.spawn(1, first["maddrs"], args=(first["peer_id"],))
        second = g.wait_for("ready", 1, g.startup_timeout)
        tx = g.wait_for("tx", 1, 120)
        rx = g.wait_for("rx", 0, 120)
    finally:
        g.stop()
    assert g.orphans == []
    assert all(tx["ok"]) and len(tx["ok"]) == N_MSGS
    assert "duplicate" in tx["refused"], tx["refused"]
    assert rx["order"] == [*range(N_MSGS), N_MSGS]  # in order; the refused duplicate is not stored
    assert rx["sizes"] == [PAYLOAD]
    # one stream for the N_MSGS + 2 bulk messages, one for the small control lane (the pushed list)
    assert rx["streams"] == 2, f"{rx['streams']} streams for {N_MSGS + 3} messages"
    sent_tx, recv_tx = tx["ledger"]
    sent_rx, recv_rx = rx["ledger"]
    assert sent_tx == recv_rx and sent_rx == recv_tx, (tx["ledger"], rx["ledger"])
    assert sent_tx > (N_MSGS + 2) * PAYLOAD
    # the leader's pushed list is adopted like its DHT record: only if the sender leads (smallest ID)
    sender, receiver = second["peer_id"], first["peer_id"]
    assert rx["pushed_from"] == [sender] and rx["pushed_types"] == ["bytes"]  # as a DHT record
    if sender < receiver:
        assert rx["group"] == [sender, sorted([sender, receiver])]
    else:
        assert rx["group"] is None
    print(
        f"{N_MSGS + 2} messages on {rx['streams']} stream; "
        f"ledger sender {tx['ledger']}, receiver {rx['ledger']}"
    )


@pytest.mark.parametrize("lane_type", ["agg", "part", "have"])
def test_lanes(lane_type: str) -> None:
    from peers.wire.channels import lane_of
    from peers.wire.messages import Envelope

    env = Envelope(type=lane_type, run="r", kind="k", round=0, frames=0 if lane_type == "have" else 1)
    assert lane_of(env) == {"agg": "agg", "part": "bulk", "have": "ctl"}[lane_type]
