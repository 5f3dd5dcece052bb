"""Intruders: a non-member peer's floods against a collective's stream handler (simulation only).

Each function runs on an intruder's own :class:`peers.PeerNode` event loop (``node.loop.run``) and
talks to a victim's ``P2PCollective`` handler (``swarmtrain.<run>.collective``) with raw frames, as
a peer that never joins a round would: the resource attacks that docs/architecture.md, "Budgets, not
hopes", defends against. They report what the victim let them do, so tests can assert the defences:

* :func:`stalled_streams`: many streams, each announcing one large frame, never sending it (an
  allocation before the bytes arrive);
* :func:`zero_byte_flood`: many zero-byte messages on one stream (entries that cost no bytes);
* :func:`trickle`: a message sent one byte at a time (a stream held for a timeout per frame);
* :func:`future_flood`: large messages for rounds this peer is not a member of;
* :func:`refused_flood`: large messages for a round long gone, again and again (a member's
  messages the victim refuses but would read to stay in step);
* :func:`offer`: well-formed messages (a join, a member list, a part) as a member would send them.

Nothing in the library imports this module.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from peers.wire.messages import Envelope, decode_ack, encode_envelope, encode_frame_length

__all__ = [
    "Target",
    "stalled_streams",
    "zero_byte_flood",
    "trickle",
    "future_flood",
    "refused_flood",
    "offer",
]

_FRAME = 16 * 1024 * 1024  # the largest frame length a prefix may announce


@dataclass(frozen=True)
class Target:
    """A victim's collective handler.

    Attributes:
        p2p: the intruder's hivemind ``P2P``.
        peer: the victim's peer ID (base58).
        run_id: the run the victim's collective serves.
        kind: the round kind to aim at.
    """

    p2p: Any
    peer: str
    run_id: str
    kind: str = "reduce"

    @property
    def handler(self) -> str:
        """The victim's stream handler name."""
        return f"swarmtrain.{self.run_id}.collective"

    async def open(self) -> tuple[Any, Any]:
        """A fresh stream to the victim's handler: ``(reader, writer)``."""
        from hivemind.p2p import PeerID

        _, reader, writer = await self.p2p.call_binary_stream_handler(
            PeerID.from_base58(self.peer), self.handler
        )
        return reader, writer

    def envelope(self, round_id: int, chunk: int = 0, nbytes: int = 0, typ: str = "part") -> Envelope:
        """A well-formed header of this run (one data frame when ``nbytes``)."""
        frames = 1 if nbytes else 0
        return Envelope(
            type=typ,
            run=self.run_id,
            kind=self.kind,
            round=round_id,
            chunk=chunk,
            frames=frames,
            nbytes=nbytes,
        )


def _frame(data: bytes) -> bytes:
    return encode_frame_length(len(data)) + data


async def _send(reader: Any, writer: Any, env: Envelope, frames: list[bytes], end: float) -> bool:
    """Send one message (header and frames) and wait, until ``end``, for its ack; whether it was
    accepted."""
    writer.write(_frame(encode_envelope(env)) + b"".join(_frame(f) for f in frames))
    await asyncio.wait_for(writer.drain(), max(end - time.monotonic(), 0.01))
    prefix = await asyncio.wait_for(reader.readexactly(4), max(end - time.monotonic(), 0.01))
    good, _ = decode_ack(await reader.readexactly(int.from_bytes(prefix, "big")))
    return bool(good)


async def _closed(reader: Any, timeout: float) -> bool:
    """Whether the victim closed the stream (EOF or reset) within ``timeout`` seconds; acks are read
    and ignored."""
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            data = await asyncio.wait_for(reader.read(65536), max(end - time.monotonic(), 0.01))
            if not data:
                return True
    except asyncio.TimeoutError:
        return False
    except (ConnectionError, OSError):
        return True
    return False


async def stalled_streams(t: Target, n: int, round_id: int, hold: float) -> dict[str, int]:
    """Open ``n`` streams; on each, a header announcing one 16 MiB frame and that frame's length
    prefix, never its body. Keep them ``hold`` seconds.

    Returns:
        ``{"opened": ..., "closed_by_victim": ...}`` (streams the victim closed within ``hold``).
    """
    streams = []
    for i in range(n):
        try:
            reader, writer = await t.open()
        except Exception:
            break
        env = t.envelope(round_id, chunk=i, nbytes=_FRAME)
        writer.write(_frame(encode_envelope(env)) + encode_frame_length(_FRAME))
        try:
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        streams.append((reader, writer))
    closed = await asyncio.gather(*(_closed(r, hold) for r, _ in streams))
    for _, w in streams:
        w.close()
    return {"opened": len(streams), "closed_by_victim": sum(closed)}


async def zero_byte_flood(t: Target, n: int, round_id: int, timeout: float) -> dict[str, int]:
    """Send ``n`` zero-byte messages (distinct chunks) back to back on one stream and count the acks.

    Returns:
        ``{"sent": n, "accepted": ..., "refused": ...}``; messages without an ack were neither.
    """
    reader, writer = await t.open()
    ok = refused = 0

    async def acks() -> None:
        nonlocal ok, refused
        while ok + refused < n:
            prefix = await reader.readexactly(4)
            good, _ = decode_ack(await reader.readexactly(int.from_bytes(prefix, "big")))
            ok, refused = ok + good, refused + (not good)

    task = asyncio.ensure_future(acks())
    try:
        for i in range(0, n, 1000):
            batch = b"".join(
                _frame(encode_envelope(t.envelope(round_id, chunk=c))) for c in range(i, min(i + 1000, n))
            )
            writer.write(batch)
            await asyncio.wait_for(writer.drain(), timeout)
        await asyncio.wait_for(task, timeout)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        task.cancel()
        writer.close()
    return {"sent": n, "accepted": ok, "refused": refused}


async def trickle(t: Target, round_id: int, nbytes: int, interval: float, limit: float) -> dict[str, float]:
    """Announce a message of ``nbytes`` in four frames and send it one byte every ``interval`` s.

    Returns:
        ``{"held_s": ..., "closed": 0/1, "bytes_sent": ...}``: how long the victim kept the stream
        (up to ``limit`` seconds, when ``closed`` is 0).
    """
    reader, writer = await t.open()
    env = Envelope(type="part", run=t.run_id, kind=t.kind, round=round_id, chunk=7, frames=4, nbytes=nbytes)
    per = [nbytes // 4] * 3 + [nbytes - 3 * (nbytes // 4)]
    wire = _frame(encode_envelope(env)) + b"".join(encode_frame_length(k) + b"z" * k for k in per)
    t0 = time.monotonic()
    sent = 0
    closed = False
    watch = asyncio.ensure_future(_closed(reader, limit))
    try:
        while sent < len(wire) and time.monotonic() - t0 < limit and not watch.done():
            writer.write(wire[sent : sent + 1])
            sent += 1
            await asyncio.sleep(interval if sent > 4 else 0.0)  # the header's prefix goes at once
        closed = await watch
    except (ConnectionError, OSError):
        closed = True
    finally:
        watch.cancel()
        writer.close()
    return {"held_s": time.monotonic() - t0, "closed": float(closed), "bytes_sent": float(sent)}


async def future_flood(
    t: Target, rounds: range, per_round: int, nbytes: int, timeout: float
) -> dict[str, int]:
    """Send ``per_round`` messages of ``nbytes`` random-looking bytes for each round in ``rounds``, one
    stream per round (opened again when the victim closes one).

    Returns:
        ``{"offered": bytes offered, "accepted": bytes the victim acknowledged as stored}``.
    """
    body = bytes(range(256)) * (nbytes // 256) + b"\0" * (nbytes % 256)
    offered = accepted = 0
    end = time.monotonic() + timeout
    for r in rounds:
        if time.monotonic() >= end:
            break
        try:
            reader, writer = await t.open()
        except Exception:
            continue
        try:
            for c in range(per_round):
                offered += nbytes
                good = await _send(reader, writer, t.envelope(r, chunk=c, nbytes=nbytes), [body], end)
                accepted += nbytes if good else 0
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
    return {"offered": offered, "accepted": accepted}


async def refused_flood(t: Target, round_id: int, nbytes: int, seconds: float) -> dict[str, int]:
    """For ``seconds``, send messages of ``nbytes`` for round ``round_id`` (one the victim refuses
    but, staying in step, would read), each waiting for its ack, on one stream at a time (a new one
    when the victim closes it).

    Returns:
        ``{"offered": bytes offered, "acked": messages acknowledged, "streams": streams opened}``.
    """
    body = bytes(range(256)) * (nbytes // 256) + b"\0" * (nbytes % 256)
    out = {"offered": 0, "acked": 0, "streams": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            reader, writer = await t.open()
        except Exception:
            await asyncio.sleep(0.1)
            continue
        out["streams"] += 1
        try:
            for c in range(1 << 30):
                if time.monotonic() >= end:
                    break
                out["offered"] += nbytes
                await _send(reader, writer, t.envelope(round_id, chunk=c, nbytes=nbytes), [body], end)
                out["acked"] += 1
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
    return out


async def offer(t: Target, messages: list[tuple[Envelope, list[bytes]]], timeout: float) -> int:
    """Send well-formed messages (header and frames) on one stream, each waiting for its ack.

    Returns:
        How many the victim acknowledged as accepted (a refused sender's stream is closed: 0).
    """
    accepted = 0
    end = time.monotonic() + timeout
    try:
        reader, writer = await t.open()
    except Exception:
        return 0
    try:
        for env, frames in messages:
            accepted += int(await _send(reader, writer, env, frames, end))
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        writer.close()
    return accepted
