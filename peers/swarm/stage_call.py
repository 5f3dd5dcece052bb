"""A trainer's requests to stage servers (``peers.swarm.client``), on the wire.

* :func:`request`: one request on its own stream: the envelope and frames out, then the server's ack
  (a refusal raises :class:`Refused`), its reply envelope (checked to answer this request) and the
  reply's frames, bounded by the stage's packet cap; bytes are counted in the node's ledger.
* :func:`gather_steps`: the step requests of one close, to every server of every stage at once;
  the servers of a stage take a step in one round, so once one answered the others have a grace of
  the time it took (at least ``min_grace`` s) before they are given up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from peers.dht.node import PeerNode
from peers.swarm.protocol import ACTIVATIONS, GRADIENTS, REPLY, handler_name
from peers.wire.messages import Envelope, decode_ack, decode_envelope, encode_envelope
from peers.wire.transport import (
    read_data_frames,
    read_envelope,
    read_frame,
    widen_send_buffer,
    write_frame,
    write_frame_drained,
)
from swarmtrain.core.errors import PeerTimeoutError, ProtocolError, SwarmError

__all__ = ["Refused", "failure_reason", "gather_steps", "request"]


class Refused(SwarmError):
    """The server answered with a refusal (busy, invalid request)."""


def failure_reason(e: BaseException) -> str:
    """Why a request failed, for the reroute counts."""
    if isinstance(e, Refused):
        return "busy" if "busy" in str(e) else "refused"
    return "timeout" if isinstance(e, PeerTimeoutError | TimeoutError) else "error"


async def request(
    node: PeerNode, peer_id: str, env: Envelope, frames: Sequence[bytes], timeout: float, max_packet: int
) -> tuple[Envelope, list[bytes]]:
    """Send ``env`` and ``frames`` to stage server ``peer_id``; its reply envelope and frames.

    Raises:
        Refused: the server refused the request.
        PeerTimeoutError: no whole reply within ``timeout`` seconds.
        SwarmError: no stream, a broken one, or a reply to another request (``ProtocolError``).
    """
    from hivemind.p2p import PeerID

    try:
        return await asyncio.wait_for(
            _exchange(node, PeerID.from_base58(peer_id), env, frames, max_packet), timeout
        )
    except asyncio.TimeoutError:
        raise PeerTimeoutError(f"{env.type} to {peer_id[:16]} took over {timeout:.2f} s") from None


async def _exchange(
    node: PeerNode, peer: Any, env: Envelope, frames: Sequence[bytes], max_packet: int
) -> tuple[Envelope, list[bytes]]:
    try:
        _, reader, writer = await node.p2p.call_binary_stream_handler(
            peer, handler_name(node.run_id, env.index)
        )
    except Exception as e:  # p2pd reports a dead or unknown peer with several error types
        raise SwarmError(f"cannot open a stream: {type(e).__name__}: {e}") from None
    sent = received = 0
    kind_out = env.kind
    try:
        widen_send_buffer(writer)
        sent += write_frame(writer, encode_envelope(env))
        for f in frames:
            sent += await write_frame_drained(writer, f)
        await writer.drain()
        ack = await read_frame(reader, 1024, 3600.0)
        received += 4 + len(ack)
        ok, err = decode_ack(ack)
        if not ok:
            raise Refused(f"refused: {err}")
        body, n = await read_envelope(reader, 3600.0)
        received += n
        head = decode_envelope(body)
        if head.type != REPLY or head.run != env.run or head.round != env.round or head.index != env.index:
            raise ProtocolError("the server answered another request")
        kind_out = head.kind if head.kind in (ACTIVATIONS, GRADIENTS) else env.kind
        got, n = await read_data_frames(reader, head, max_total=max_packet, timeout=3600.0)
        received += n
        return head, got
    except (ConnectionError, OSError, asyncio.IncompleteReadError) as e:
        raise SwarmError(f"stream broke: {e}") from None
    finally:
        node.ledger.add_sent(env.kind, env.index, sent)
        node.ledger.add_received(kind_out, env.index, received)
        writer.close()


async def gather_steps(calls: list[tuple[int, str, Any]], step_timeout: float, min_grace: float) -> list[Any]:
    """Run the step requests ``(stage, peer, request)``; a stage's stragglers are cancelled once a
    grace after its first answer is over. Returns each request's reply or exception, in order."""
    t0 = time.monotonic()
    tasks = [asyncio.ensure_future(c) for _, _, c in calls]
    stage_of = {t: calls[i][0] for i, t in enumerate(tasks)}
    answered: dict[int, float] = {}  # stage -> when its first server answered
    pending = set(tasks)

    def limit(t: asyncio.Future[Any]) -> float:
        first = answered.get(stage_of[t])
        if first is None:
            return t0 + step_timeout
        return first + max(min_grace, first - t0)

    while pending:
        wait = max(0.0, min(limit(t) for t in pending) - time.monotonic())
        done, pending = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            if not t.cancelled() and t.exception() is None:
                answered.setdefault(stage_of[t], time.monotonic())
        now = time.monotonic()
        for t in [t for t in pending if now >= limit(t)]:
            t.cancel()
            pending.discard(t)
    await asyncio.gather(*tasks, return_exceptions=True)  # a cancelled task is done only then
    out: list[Any] = []
    for t in tasks:
        if t.cancelled():
            out.append(PeerTimeoutError("no answer within the grace after its stage's first"))
        else:
            out.append(t.exception() or t.result())
    return out
