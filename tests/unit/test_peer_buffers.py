"""The peer's buffer settings: a wider send buffer on bulk streams, glibc heap retention."""

from __future__ import annotations

import asyncio
import os
import platform
import socket
import subprocess
import sys

import pytest

from peers.wire.transport import SEND_BUFFER, widen_send_buffer


def test_widen_send_buffer_raises_so_sndbuf_of_the_stream_socket() -> None:
    async def go() -> tuple[int, int]:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        _, writer = await asyncio.open_unix_connection(sock=a)
        before = a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        widen_send_buffer(writer)
        after = writer.transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        writer.close()
        b.close()
        return before, after

    before, after = asyncio.run(go())
    cap = (
        int(open("/proc/sys/net/core/wmem_max").read())
        if os.path.exists("/proc/sys/net/core/wmem_max")
        else 0
    )
    if cap and cap < SEND_BUFFER:
        assert after >= before  # the kernel caps it; never shrinks it
    else:
        assert after >= SEND_BUFFER > before


def test_widen_send_buffer_ignores_a_writer_without_a_socket() -> None:
    class NoSocket:
        class transport:  # noqa: N801 - stands in for an asyncio transport
            @staticmethod
            def get_extra_info(name: str) -> None:
                return None

    widen_send_buffer(NoSocket())  # no error


def _run(code: str, **env: str) -> str:
    full = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, check=True)
    return out.stdout.strip()


_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not _GLIBC, reason="mallopt is glibc-only; elsewhere the tuning is off by design")
def test_retain_freed_buffers_keeps_a_freed_4mib_buffer_in_the_heap() -> None:
    """A round's pattern: 16 live 4 MiB buffers, then all freed. After the tuning the next rounds
    reuse the heap and fault no fresh pages; without it glibc trims (or unmaps) the freed 64 MiB and
    every round faults all its pages again."""
    code = """
import resource, sys
from peers.wire.memory import retain_freed_buffers
on = retain_freed_buffers()
def round_():
    bufs = [bytearray(4 << 20) for _ in range(16)]
    del bufs
round_()  # warm up: the heap grows once
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    round_()
print(on, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""
    on, faults_on = _run(code).split()
    off, faults_off = _run(code, SWARMTRAIN_KEEP_HEAP="0").split()
    assert (on, off) == ("True", "False")
    # 5 rounds x 64 MiB = 81920 pages when every buffer is fresh; a reused heap faults (almost) none
    assert int(faults_on) < 2000 < 40000 < int(faults_off)


def test_retain_freed_buffers_leaves_an_operators_malloc_settings_alone() -> None:
    code = "from peers.wire.memory import retain_freed_buffers; print(retain_freed_buffers())"
    assert _run(code, MALLOC_TRIM_THRESHOLD_="131072") == "False"
