"""The delay proxy on loopback (no root, no namespaces): bytes arrive intact and in order both ways,
every byte is counted, an unknown source is refused, EOF is passed on, and a round trip can never be
shorter than the two one-way delays (a lower bound only: how much longer it takes depends on load)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from swarmtrain.simulation.delay_proxy import DelayProxy, Target

ONE_WAY_S = 0.03


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def echo_port() -> Iterator[int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(30)

    def serve() -> None:
        try:
            while True:
                conn, _ = srv.accept()
                with conn:
                    while data := conn.recv(65536):
                        conn.sendall(data)
        except OSError:
            return

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield int(srv.getsockname()[1])
    srv.close()


def _proxy(echo_port: int, source: int | None = 0) -> tuple[DelayProxy, int]:
    port = _free_port()
    target = Target(node=1, listen=("127.0.0.1", port), connect=("127.0.0.1", echo_port))
    proxy = DelayProxy([target], delay=lambda a, b: ONE_WAY_S, source_of=lambda ip: source)
    return proxy.start(), port


def _recv_exactly(c: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = c.recv(1 << 20)
        if not chunk:
            break
        out += chunk
    return bytes(out)


def test_bytes_arrive_intact_both_ways_and_are_counted(echo_port: int) -> None:
    proxy, port = _proxy(echo_port)
    try:
        payload = bytes(range(256)) * 20_000  # 5 MiB: many chunks, more than the proxy buffers
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            c.settimeout(30)
            sender = threading.Thread(target=c.sendall, args=(payload,), daemon=True)
            sender.start()
            got = _recv_exactly(c, len(payload))
            sender.join(30)
            c.shutdown(socket.SHUT_WR)  # EOF goes through the proxy to the echo and back
            assert c.recv(1) == b""
        assert got == payload
        deadline = time.monotonic() + 10  # the counters are updated by the proxy's thread
        while proxy.bytes.get((1, 0), 0) < len(payload) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.bytes == {(0, 1): len(payload), (1, 0): len(payload)}
        assert proxy.connections == 1
    finally:
        proxy.stop()


def test_a_round_trip_takes_at_least_both_delays(echo_port: int) -> None:
    proxy, port = _proxy(echo_port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            c.settimeout(30)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(3):
                t0 = time.perf_counter()
                c.sendall(b"x")
                assert c.recv(1) == b"x"
                assert time.perf_counter() - t0 >= 2 * ONE_WAY_S * 0.99
    finally:
        proxy.stop()


def test_unknown_sources_are_refused(echo_port: int) -> None:
    proxy, port = _proxy(echo_port, source=None)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            c.settimeout(30)
            assert c.recv(1) == b""  # closed without reaching the target
        assert proxy.refused == 1 and proxy.connections == 0
    finally:
        proxy.stop()


def test_a_listener_that_cannot_open_fails_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proxy = DelayProxy(
            [Target(1, ("127.0.0.1", port), ("127.0.0.1", 1))], delay=lambda a, b: 0.0, source_of=lambda ip: 0
        )
        with pytest.raises(OSError):
            proxy.start()
