"""``peers.wire.framereader``: a buffered-protocol reader that takes over a live asyncio stream.

Real unix socket pairs and asyncio transports: bytes the ``StreamReader`` already held are kept,
frames come back whole and in order, reading pauses when far ahead, and a short stream raises the
same ``IncompleteReadError`` as ``StreamReader.readexactly``.
"""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from peers.wire.framereader import MAX_AHEAD, FrameReader, attach
from peers.wire.messages import encode_frame_length
from peers.wire.transport import read_envelope_or_eof, read_frame


async def _pair() -> tuple[socket.socket, asyncio.StreamReader, asyncio.StreamWriter]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setblocking(False)
    reader, writer = await asyncio.open_unix_connection(sock=b)
    return a, reader, writer


def test_takes_over_pending_bytes_and_reads_frames_in_order() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        a, reader, writer = await _pair()
        frames = [os.urandom(n) for n in (0, 1, 1000, 300_000, 5 * 1024 * 1024 + 7)]
        wire = b"".join(encode_frame_length(len(f)) + f for f in frames)
        await loop.sock_sendall(a, wire[:10])
        assert await reader.readexactly(2) == wire[:2]  # the stream reader now holds 8 more bytes
        fr = attach(reader, writer)
        assert isinstance(fr, FrameReader)
        send = asyncio.ensure_future(loop.sock_sendall(a, wire[10:]))
        rest = await fr.readexactly(2)
        assert bytes(rest) == wire[2:4]
        got = [bytes(await read_frame(fr, 8 << 20, 10.0)) for _ in frames[1:]]
        first_len = len(frames[0])
        assert first_len == 0 and got == frames[1:]
        await send
        a.close()
        assert await read_envelope_or_eof(fr, 5.0) is None  # clean end between messages
        writer.close()

    asyncio.run(main())


def test_pauses_when_far_ahead_and_short_stream_raises() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        a, reader, writer = await _pair()
        fr = attach(reader, writer)
        assert isinstance(fr, FrameReader)
        blob = os.urandom(MAX_AHEAD + 1024 * 1024)
        send = asyncio.ensure_future(loop.sock_sendall(a, blob))
        for _ in range(200):  # let it run ahead of any reader
            await asyncio.sleep(0.005)
            if fr._paused:
                break
        assert fr._paused
        assert bytes(await fr.readexactly(len(blob))) == blob
        await send
        await loop.sock_sendall(a, b"abc")
        a.close()
        with pytest.raises(asyncio.IncompleteReadError) as e:
            await fr.readexactly(10)
        assert e.value.partial == b"abc"
        writer.close()

    asyncio.run(main())


def test_clocked_reads_and_skips_keep_step_with_data_arriving_meanwhile() -> None:
    """With a clock the reader wakes one loop iteration later; the socket keeps delivering into the
    side buffer meanwhile (an empty target buffer must never be handed out)."""
    from peers.wire.framereader import MessageClock

    async def main() -> None:
        loop = asyncio.get_running_loop()
        a, reader, writer = await _pair()
        fr = attach(reader, writer)
        assert isinstance(fr, FrameReader)
        frames = [os.urandom(n) for n in (3 << 20, 1 << 20, 5 << 20, 7)]
        send = asyncio.ensure_future(loop.sock_sendall(a, b"".join(frames)))
        clock = MessageClock(sum(map(len, frames)), fr.received)
        assert bytes(await fr.readexactly(len(frames[0]), clock)) == frames[0]
        await fr.skip(len(frames[1]), clock)
        assert bytes(await fr.readexactly(len(frames[2]), clock)) == frames[2]
        assert bytes(await fr.readexactly(7, clock)) == frames[3]
        await send
        a.close()
        writer.close()

    asyncio.run(main())


def test_a_trickling_sender_is_cut_off_by_the_minimum_rate() -> None:
    import time

    from peers.wire.framereader import MessageClock
    from swarmtrain.core.errors import PeerTimeoutError

    async def main() -> float:
        loop = asyncio.get_running_loop()
        a, reader, writer = await _pair()
        fr = attach(reader, writer)
        assert isinstance(fr, FrameReader)

        async def trickle() -> None:
            for _ in range(100):
                await loop.sock_sendall(a, b"x")
                await asyncio.sleep(0.2)

        task = asyncio.ensure_future(trickle())
        t0 = time.monotonic()
        with pytest.raises(PeerTimeoutError, match="minimum rate"):
            await fr.readexactly(1000, MessageClock(1000, fr.received, grace=1.0, min_rate=100))
        held = time.monotonic() - t0
        task.cancel()
        a.close()
        writer.close()
        return held

    held = asyncio.run(main())
    assert held < 3.5  # the grace period, then the first check that finds it below the rate
