"""Emulated links: network namespaces on a bridge, veth pairs and ``tc tbf`` rate caps.

Layout for a prefix ``P`` (``swt`` for ``benchmarks/wan_overlap.py``, ``swr`` for ``simulate
--topology``; every name this module creates starts with it, and only addresses in ``SUBNET.0/24``
are used, inside namespaces it creates)::

    netns P-hub:  bridge Pbr  <- Ph<i> (veth)               (no address, just switching)
    netns P-n<i>: eth0 = SUBNET.<i+1>/24 (the other end of Ph<i>), lo up

Node ``i``'s link is rate-capped in both directions with a token bucket filter: on ``eth0`` inside its
namespace (what it sends) and on ``Ph<i>`` in the hub (what it receives). The kernels here have no
``netem`` qdisc, so there is no added latency here; ``tbf`` caps the rate only (latency comes from
``swarmtrain.simulation.delay_proxy``). Every route a fabric makes names its TCP congestion control
(``congctl``, ``cubic`` by default): the emulated hop has almost no base RTT (the delay is added in
userspace), and BBR, the default on some hosts, then sizes its window for that tiny RTT and leaves a
capped link a third idle when two flows share it (``docs/decisions.md``). Root is required. The
root namespace is never touched: each veth pair is created inside the hub and one end moved into its
node's namespace.

Besides building, this module lets a process (or one of its threads) *enter* a namespace
(:func:`enter`, ``setns(2)``), which is how ``simulate --topology`` starts peers in their regions
without ``ip netns exec``: a spawned peer enters its namespace before it opens any socket, and its
DHT process and ``p2pd`` daemon inherit it.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swarmtrain.core.errors import ConfigError, SwarmError

__all__ = [
    "NetnsError",
    "Fabric",
    "Wan",
    "cleanup",
    "namespaces",
    "require_root",
    "enter",
    "in_namespace",
    "socket_in",
    "run_cmd",
]

NETNS_DIR = "/var/run/netns"
CLONE_NEWNET = 0x40000000

#: the benchmark's addresses (benchmarks/wan_overlap.py, prefix "swt"): 10.213.0.0/24
SUBNET = "10.213.0"


class NetnsError(SwarmError):
    """A command that builds the emulated network failed (its stderr is in the message)."""


def run_cmd(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one ``ip``/``tc`` command (30 s at most); raise :class:`NetnsError` with its stderr."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    except FileNotFoundError as e:
        raise NetnsError(f"`{cmd[0]}` is not installed: {e}") from None
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def require_root(what: str = "emulated network namespaces") -> None:
    """Raise a one-line :class:`ConfigError` (exit 2 in the CLI) unless this process is root."""
    if os.geteuid() != 0:
        raise ConfigError(
            f"{what} need root (run as root or with sudo); this process has euid {os.geteuid()}"
        )


def namespaces(prefix: str = "swt") -> list[str]:
    """Names of the namespaces a fabric with ``prefix`` owns that exist now (a crash's leftovers too)."""
    out = run_cmd("ip", "netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n == f"{prefix}-hub" or n.startswith(f"{prefix}-n")]


def cleanup(prefix: str = "swt") -> None:
    """Delete every namespace a fabric with ``prefix`` owns (their veths and qdiscs go with them)."""
    for ns in namespaces(prefix):
        run_cmd("ip", "netns", "del", ns, check=False)


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def enter(ns: str) -> None:
    """Move the calling thread into network namespace ``ns`` (threads and processes it starts later
    inherit it; sockets already open stay where they were made)."""
    _setns(os.path.join(NETNS_DIR, ns))


def socket_in(ns: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A new socket that lives in namespace ``ns`` (made by a short-lived thread that enters it, so
    the caller's threads never change namespace; a socket keeps its namespace for life)."""
    box: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            enter(ns)
            box.append(socket.socket(family, kind))
        except BaseException as e:  # handed to the caller
            box.append(e)

    t = threading.Thread(target=make, name=f"swarmtrain-netns-{ns}", daemon=True)
    t.start()
    t.join()
    out = box[0] if box else NetnsError(f"socket_in({ns}): no socket")
    if isinstance(out, BaseException):
        raise out
    return out


def in_namespace(ns: str, target: Callable[..., Any], *args: Any) -> Any:
    """``target(*args)`` inside namespace ``ns``: a picklable entry for a spawned process (use
    ``functools.partial(in_namespace, ns, target)``)."""
    enter(ns)
    return target(*args)


@dataclass
class Fabric:
    """Nodes on one bridge, node ``i``'s link capped at ``rates_mbit[i]`` (None: uncapped).

    Use as a context manager: it removes its prefix's leftovers first and always deletes its
    namespaces on exit. With ``hub_ip`` the nodes are *routed*, not bridged to each other: node
    ``i`` has ``ip(i)/32`` and reaches only the hub (``hub_ip`` on its bridge, with ``hub_addrs`` on
    its ``lo``) and, through it, the prefixes in ``routes``: whatever runs in the hub (the delay
    proxy) is then the only way from one node to another. Every route it adds or replaces (in the
    nodes and in the hub) carries ``congctl congestion``; ``None`` keeps the host's default.
    """

    rates_mbit: Sequence[float | None]
    prefix: str = "swt"
    subnet: str = SUBNET
    burst_kbit: int = 64
    hub_ip: str | None = None
    hub_addrs: Sequence[str] = field(default_factory=tuple)
    routes: Sequence[str] = field(default_factory=tuple)
    congestion: str | None = "cubic"

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.rates_mbit)

    @property
    def hub(self) -> str:
        """The hub namespace (the bridge)."""
        return f"{self.prefix}-hub"

    def ns(self, i: int) -> str:
        """Namespace of node ``i``."""
        return f"{self.prefix}-n{i}"

    def ip(self, i: int) -> str:
        """Address of node ``i`` (on its ``eth0``)."""
        return f"{self.subnet}.{i + 1}"

    def __enter__(self) -> Fabric:
        require_root()
        if self.n < 1 or self.n > 200:
            raise NetnsError(f"node count {self.n} out of range 1..200")
        cleanup(self.prefix)
        try:
            self._build()
        except BaseException:
            cleanup(self.prefix)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        cleanup(self.prefix)

    def _tbf(self, ns: str, dev: str, rate_mbit: float | None) -> None:
        if rate_mbit is None:
            return
        run_cmd(
            "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
            "rate", f"{rate_mbit}mbit", "burst", f"{self.burst_kbit}kbit", "latency", "400ms",
        )  # fmt: skip

    def _cc(self) -> tuple[str, ...]:
        """The ``congctl`` words for a route (none when the host's default is kept)."""
        return () if self.congestion is None else ("congctl", self.congestion)

    def _build(self) -> None:
        p, hub = self.prefix, self.hub
        run_cmd("ip", "netns", "add", hub)
        run_cmd("ip", "-n", hub, "link", "add", f"{p}br", "type", "bridge")
        run_cmd("ip", "-n", hub, "link", "set", f"{p}br", "up")
        run_cmd("ip", "-n", hub, "link", "set", "lo", "up")
        if self.hub_ip is not None:
            run_cmd("ip", "-n", hub, "addr", "add", f"{self.hub_ip}/24", "dev", f"{p}br")
            run_cmd("ip", "-n", hub, "route", "replace", f"{self.subnet}.0/24", "dev", f"{p}br", *self._cc())
            for addr in self.hub_addrs:
                run_cmd("ip", "-n", hub, "addr", "add", addr, "dev", "lo")
        for i, rate in enumerate(self.rates_mbit):
            ns, hub_dev, node_dev = self.ns(i), f"{p}h{i}", f"{p}p{i}"
            run_cmd("ip", "netns", "add", ns)
            # create the pair inside the hub, then move one end: the root namespace is never touched
            run_cmd("ip", "-n", hub, "link", "add", hub_dev, "type", "veth", "peer", "name", node_dev)
            run_cmd("ip", "-n", hub, "link", "set", node_dev, "netns", ns)
            run_cmd("ip", "-n", ns, "link", "set", node_dev, "name", "eth0")
            plen = 24 if self.hub_ip is None else 32
            run_cmd("ip", "-n", ns, "addr", "add", f"{self.ip(i)}/{plen}", "dev", "eth0")
            run_cmd("ip", "-n", ns, "link", "set", "eth0", "up")
            run_cmd("ip", "-n", ns, "link", "set", "lo", "up")
            if self.hub_ip is None:
                run_cmd("ip", "-n", ns, "route", "replace", f"{self.subnet}.0/24", "dev", "eth0", *self._cc())
            else:
                run_cmd("ip", "-n", ns, "route", "add", self.hub_ip, "dev", "eth0", *self._cc())
                for prefix in self.routes:
                    run_cmd("ip", "-n", ns, "route", "add", prefix, "via", self.hub_ip, *self._cc())
            run_cmd("ip", "-n", hub, "link", "set", hub_dev, "master", f"{p}br")
            run_cmd("ip", "-n", hub, "link", "set", hub_dev, "up")
            self._tbf(ns, "eth0", rate)
            self._tbf(hub, hub_dev, rate)

    def qdiscs(self, i: int) -> str:
        """``tc qdisc show`` of node ``i``'s eth0 (to record that the cap is in place)."""
        return run_cmd("ip", "netns", "exec", self.ns(i), "tc", "qdisc", "show", "dev", "eth0").stdout.strip()

    def transfer(self, src: int, dst: int, nbytes: int, port: int = 47123, host: str | None = None) -> float:
        """Send ``nbytes`` over TCP from node ``src`` to node ``dst`` (at ``host``, default its
        address); seconds until ``dst`` has them all.

        A direct check of connectivity and of the rate cap: with a cap, this takes at least about
        ``nbytes * 8 / rate`` (less the bucket's burst).
        """
        host = host or self.ip(dst)
        server = (
            "import socket,sys,time\n"
            "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            f"s.bind(('{self.ip(dst)}',{port}));s.listen(1);print('ready',flush=True)\n"
            "c,_=s.accept();n=0;t=time.perf_counter()\n"
            f"while n<{nbytes}:\n"
            "    b=c.recv(1<<16)\n"
            "    if not b: break\n"
            "    n+=len(b)\n"
            "print(n,time.perf_counter()-t,flush=True)\n"
        )
        client = (
            "import socket\n"
            f"c=socket.create_connection(('{host}',{port}),timeout=10)\n"
            f"c.sendall(bytes({nbytes}));c.close()\n"
        )
        py = sys.executable
        srv = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(dst), py, "-c", server], stdout=subprocess.PIPE, text=True
        )
        try:
            if srv.stdout is None or srv.stdout.readline().strip() != "ready":
                raise NetnsError("transfer: the receiving side did not start")
            run_cmd("ip", "netns", "exec", self.ns(src), py, "-c", client)
            out, _ = srv.communicate(timeout=60)
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.wait()
        got, secs = out.split()
        if int(got) != nbytes:
            raise NetnsError(f"transfer: {got} of {nbytes} bytes arrived")
        return float(secs)


class Wan(Fabric):
    """The benchmark's fabric: ``n`` nodes (prefix ``swt``, 10.213.0.0/24), every link capped at
    ``rate_mbit`` (None: uncapped)."""

    def __init__(self, n: int, rate_mbit: float | None = 20.0, burst_kbit: int = 64) -> None:
        super().__init__(rates_mbit=[rate_mbit] * n, prefix="swt", subnet=SUBNET, burst_kbit=burst_kbit)

    def __enter__(self) -> Wan:
        super().__enter__()
        return self
