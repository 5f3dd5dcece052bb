"""``peers.framereader``: a buffered-protocol reader that takes over a live asyncio stream.

Real unix socket pairs and asyncio transports: bytes the ``StreamReader`` already held are kept,
frames come back whole and in order, reading pauses when far ahead, and a short stream raises the
same ``IncompleteReadError`` as ``StreamReader.readexactly``.
"""

from __future__ import annotations

import asyncio
import os
import socket

import pytest

from peers.framereader import MAX_AHEAD, FrameReader, attach
from peers.messages import encode_frame_length
from peers.transport import read_envelope_or_eof, read_frame


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
