"""What an emulated network itself allows: every node sends to every other at once over plain TCP.

A butterfly round's traffic without the protocol: each node opens one connection to each other node
(through the delay proxy, to the address the swarm knows it by), all start together once every
connection is open, and the time runs until the last byte arrived. ``benchmarks/wan.py`` reports it
beside each round as the network's floor, so a round's excess splits into what the network costs
(``tbf`` shaping, the proxy, TCP) and what the protocol adds.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from swarmtrain.core.errors import ConfigError, SwarmError
from swarmtrain.simulation.netns import socket_in

__all__ = ["Endpoint", "all_to_all_s"]

_TIMEOUT = 60.0


@dataclass(frozen=True)
class Endpoint:
    """One node: its namespace, the address it listens on, the address others dial it at."""

    ns: str
    ip: str
    dial_ip: str


@dataclass
class _Tally:
    """What the threads of one check report (each thread appends; no read-modify-write)."""

    got: dict[int, list[int]]  # bytes per connection, by receiver
    last: list[float] = field(default_factory=list)  # when each connection's last byte came
    errors: list[BaseException] = field(default_factory=list)


def _listen(node: Endpoint, port: int, backlog: int) -> socket.socket:
    srv = socket_in(node.ns)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((node.ip, port))
    srv.listen(backlog)
    srv.settimeout(_TIMEOUT)
    return srv


def _read(tally: _Tally, i: int, conn: socket.socket) -> None:
    buf, total = bytearray(1 << 16), 0
    try:
        with conn:
            conn.settimeout(_TIMEOUT)
            while k := conn.recv_into(buf):
                total += k
    except OSError as e:
        tally.errors.append(e)
    tally.got[i].append(total)
    tally.last.append(time.perf_counter())


def _serve(tally: _Tally, i: int, srv: socket.socket, conns: int) -> None:
    try:
        readers = []
        for _ in range(conns):
            conn, _addr = srv.accept()
            readers.append(threading.Thread(target=_read, args=(tally, i, conn), daemon=True))
            readers[-1].start()
        for t in readers:
            t.join(2 * _TIMEOUT)
    except OSError as e:
        tally.errors.append(e)


def _send(
    tally: _Tally, src: Endpoint, dst: Endpoint, port: int, go: threading.Barrier, data: memoryview
) -> None:
    cli = socket_in(src.ns)
    try:
        cli.settimeout(_TIMEOUT)
        cli.connect((dst.dial_ip, port))
        go.wait()
        cli.sendall(data)
    except (OSError, threading.BrokenBarrierError) as e:
        tally.errors.append(e)
        go.abort()
    finally:
        cli.close()


def all_to_all_s(nodes: Sequence[Endpoint], nbytes: int, port: int) -> float:
    """Seconds from the moment every connection is open until each node of ``nodes`` received
    ``nbytes`` from every other; raises ``SwarmError`` when a byte is missing or a socket failed."""
    n = len(nodes)
    if n < 2 or nbytes <= 0:
        raise ConfigError("an all-to-all needs two nodes or more and nbytes > 0")
    tally = _Tally({i: [] for i in range(n)})
    servers = [_listen(node, port, n) for node in nodes]
    go = threading.Barrier(n * (n - 1) + 1, timeout=_TIMEOUT)
    data = memoryview(bytes(nbytes))
    threads = [threading.Thread(target=_serve, args=(tally, i, servers[i], n - 1)) for i in range(n)]
    threads += [
        threading.Thread(target=_send, args=(tally, nodes[a], nodes[b], port, go, data))
        for a in range(n)
        for b in range(n)
        if a != b
    ]
    for t in threads:
        t.daemon = True
        t.start()
    try:
        go.wait()
        t0 = time.perf_counter()
    except threading.BrokenBarrierError:
        t0 = 0.0
    for t in threads:
        t.join(2 * _TIMEOUT)
    for srv in servers:
        srv.close()
    expect = (n - 1) * nbytes
    short = {i: sum(v) for i, v in tally.got.items() if sum(v) != expect}
    if tally.errors or short or not tally.last:
        first = f"{type(tally.errors[0]).__name__}: {tally.errors[0]}; " if tally.errors else ""
        raise SwarmError(f"all-to-all failed: {first}bytes received {short}, {expect} expected each")
    return max(tally.last) - t0
