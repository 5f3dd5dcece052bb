"""Emulated regions for ``swarmtrain simulate --topology FILE.toml``: namespaces, rate caps, delays.

:class:`EmulatedRegions` builds the network a :class:`~swarmtrain.simulation.topology.AddressPlan`
describes and tears it down on every way out:

- one network namespace per node (the bootstrap and each peer), routed to a hub namespace over a
  veth pair capped with ``tc tbf`` in both directions at the node's region rate
  (``swarmtrain.simulation.netns.Fabric``);
- in the hub, a :class:`~swarmtrain.simulation.delay_proxy.DelayProxy` listening on one address per
  node and adding half the pair's RTT to each direction. Nodes have no route to each other, only to
  the hub: every byte between two peers crosses the proxy (and both their caps). Each peer listens on
  its own address and announces the proxy's address for it (``peers.announce_maddrs``), so the
  swarm dials it through the proxy: without ``netem`` or a transparent redirect on these kernels, the
  announced address is what routes every dial (DHT, collective, state download) through the delay;
- each peer process enters its namespace (``setns``) as its first act, before any socket exists; its
  DHT process and ``p2pd`` inherit the namespace.

Cleanup: leaving the ``with`` block (normally, by an exception or Ctrl-C; SIGTERM is turned into
``SystemExit`` while the network exists) deletes every namespace whose name starts with ``swr-``
(their veths, addresses and qdiscs go with them). A run that was SIGKILLed leaves its namespaces; the
next run removes them first. A lock file keeps two runs from building over each other. Root only: a
non-root user gets one ``ConfigError`` line (exit 2).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any

from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError, SwarmError
from swarmtrain.simulation.delay_proxy import DelayProxy, Target
from swarmtrain.simulation.netns import Fabric, cleanup, in_namespace, namespaces, require_root, socket_in
from swarmtrain.simulation.topology import (
    HUB_IP,
    NET,
    P2P_PORT,
    PREFIX,
    AddressPlan,
    Topology,
    load_topology,
)

__all__ = ["EmulatedRegions", "emulated_regions", "check_topology", "leftover_namespaces", "LOCK_PATH"]

logger = logging.getLogger(__name__)

LOCK_PATH = Path("/run/swarmtrain-regions.lock")


def leftover_namespaces() -> list[str]:
    """The regions' namespaces that exist now (``swr-*``)."""
    return namespaces(PREFIX)


class EmulatedRegions:
    """The network of ``topology`` for a bootstrap and ``n_peers`` peers (a context manager)."""

    def __init__(self, topology: Topology, n_peers: int) -> None:
        self.topology = topology
        self.plan = AddressPlan(topology, n_peers)
        self.nodes = self.plan.nodes
        self.fabric: Fabric | None = None
        self.proxy: DelayProxy | None = None
        self.rtt_ms_measured: dict[str, float] = {}
        self._lock: IO[str] | None = None
        self._old_term: Any = None

    # -- lifecycle
    def __enter__(self) -> EmulatedRegions:
        require_root("simulate --topology (network namespaces and tc)")
        self._lock = _take_lock()
        self._catch_sigterm()
        try:
            by_ip = {n.ip: n.index for n in self.nodes}
            self.fabric = Fabric(
                rates_mbit=[n.rate_mbit for n in self.nodes],
                prefix=PREFIX,
                subnet=f"{NET}.0",
                burst_kbit=self.topology.burst_kbit,
                hub_ip=HUB_IP,
                hub_addrs=self.plan.hub_addrs(),
                routes=self.plan.routes(),
            ).__enter__()
            targets = [Target(n.index, (n.proxy_ip, P2P_PORT), (n.ip, P2P_PORT)) for n in self.nodes]
            self.proxy = DelayProxy(
                targets,
                delay=self.plan.one_way_s,
                source_of=by_ip.get,
                bind_of=lambda i: self.nodes[i].source_ip,
                ns=self.fabric.hub,
            ).start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.proxy is not None:
                self.proxy.stop()
        finally:
            self.proxy = None
            cleanup(PREFIX)  # also when the fabric failed half-built
            self.fabric = None
            self._restore_sigterm()
            if self._lock is not None:
                self._lock.close()  # releases the flock
                self._lock = None

    def _catch_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return  # someone else handles it (and must unwind through our __exit__)

        def on_term(signum: int, frame: FrameType | None) -> None:
            raise SystemExit(128 + signum)  # unwinds through every finally: peers stopped, net removed

        self._old_term = signal.signal(signal.SIGTERM, on_term)

    def _restore_sigterm(self) -> None:
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = None

    # -- what the runner uses
    def place(self, boot_cfg: Config, rank_cfgs: list[Config]) -> None:
        """Give the bootstrap's and each peer's config its node's listen and announce addresses."""
        for rank, c in [(-1, boot_cfg), *enumerate(rank_cfgs)]:
            node = self.plan.node_of_rank(rank)
            c.peers.host_maddrs = [node.host_maddr]
            c.peers.announce_maddrs = [node.announce_maddr]
            c.peers.region = node.region

    def entry(self, rank: int, target: Callable[..., Any]) -> Callable[..., Any]:
        """``target`` wrapped to run in the namespace of peer ``rank`` (-1: the bootstrap); picklable."""
        return functools.partial(in_namespace, self.plan.node_of_rank(rank).ns, target)

    # -- measuring
    def rtt_ms(self, a: int, b: int, samples: int = 7, port: int = P2P_PORT) -> float:
        """Median round trip of one byte from node ``a`` to node ``b`` through the proxy (ms), on a
        connection already open: what a ping between the two would show. ``port`` must be free on
        node ``b`` (before or after the peers run)."""
        na, nb = self.nodes[a], self.nodes[b]
        srv = socket_in(nb.ns)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((nb.ip, port))
        srv.listen(1)
        srv.settimeout(20)

        def echo() -> None:
            with contextlib.suppress(OSError):
                conn, _ = srv.accept()
                with conn:
                    conn.settimeout(20)
                    while data := conn.recv(64):
                        conn.sendall(data)

        t = threading.Thread(target=echo, daemon=True)
        t.start()
        cli = socket_in(na.ns)
        try:
            cli.settimeout(20)
            cli.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            cli.connect((nb.proxy_ip, port))
            out = []
            for _ in range(samples):
                t0 = time.perf_counter()
                cli.sendall(b"p")
                if cli.recv(1) != b"p":
                    raise SwarmError(f"rtt {a}->{b}: the echo did not come back")
                out.append((time.perf_counter() - t0) * 1000.0)
        finally:
            cli.close()
            t.join(5)
            srv.close()
        return statistics.median(out)

    def all_to_all_s(self, nodes: Sequence[int], nbytes: int, port: int = P2P_PORT) -> float:
        """Seconds for each node of ``nodes`` to send ``nbytes`` to every other one at once over plain
        TCP through the proxy (``swarmtrain.simulation.link_check``): what the emulated network itself
        allows for a round's traffic. ``port`` must be free on those nodes (before or after the
        peers run)."""
        from swarmtrain.simulation.link_check import Endpoint, all_to_all_s

        ends = [Endpoint(self.nodes[i].ns, self.nodes[i].ip, self.nodes[i].proxy_ip) for i in nodes]
        return all_to_all_s(ends, nbytes, port)

    def measure(self) -> dict[str, float]:
        """RTT (ms) between the first peers of each pair of regions (and two peers of one region,
        where it has two): ``"a->b"`` keys. Stored in :attr:`rtt_ms_measured`."""
        first: dict[str, int] = {}
        for n in self.nodes[1:]:
            first.setdefault(n.region, n.index)
        items = list(first.items())
        for k, (ra, ia) in enumerate(items):
            for rb, ib in items[k:]:
                if ia != ib:
                    self.rtt_ms_measured[f"{ra}->{rb}"] = round(self.rtt_ms(ia, ib), 2)
                else:  # two peers of one region, if there are two
                    other = next((n.index for n in self.nodes[1:] if n.region == ra and n.index != ia), None)
                    if other is not None:
                        self.rtt_ms_measured[f"{ra}->{ra}"] = round(self.rtt_ms(ia, other), 2)
        return dict(self.rtt_ms_measured)

    def report(self) -> dict[str, Any]:
        """Plain data for the JSON: the placement, configured and measured RTTs, bytes through the proxy."""
        proxy = self.proxy
        return {
            "regions": {
                n.region: [m.rank for m in self.nodes[1:] if m.region == n.region] for n in self.nodes
            },
            "bootstrap_region": self.nodes[0].region,
            "rate_mbit": {n.region: n.rate_mbit for n in self.nodes},
            "rtt_ms_configured": {
                f"{a.name}->{b.name}": self.topology.rtt_ms(a.name, b.name)
                for a in self.topology.regions
                for b in self.topology.regions
            },
            "rtt_ms_measured": dict(self.rtt_ms_measured),
            "proxy_bytes": sum(proxy.bytes.values()) if proxy else 0,
            "proxy_connections": proxy.connections if proxy else 0,
        }


def _take_lock() -> IO[str]:
    """An exclusive ``flock`` on :data:`LOCK_PATH` (freed by the kernel when its holder dies).

    Raises:
        SwarmError: another run holds it.
    """
    f = open(LOCK_PATH, "a+", encoding="utf-8")  # noqa: SIM115 - held for the network's lifetime
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise SwarmError(
            f"another `simulate --topology` run holds the emulated regions ({LOCK_PATH}); wait for it"
        ) from None
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def check_topology(path: Path, n_peers: int, *, strategy: str | None = None, intruders: int = 0) -> str:
    """Check ``--topology`` before any process starts; returns the plan's one-line description.

    Raises:
        ConfigError: one line: a bad file, a combination not supported, or not root.
    """
    topo = load_topology(path)
    plan = AddressPlan(topo, n_peers)
    if strategy == "swarm":
        raise ConfigError("--topology is not supported with --strategy swarm")
    if intruders:
        raise ConfigError("--topology does not combine with --intruders (they would run outside the regions)")
    require_root("simulate --topology (network namespaces and tc)")
    return plan.describe()


@contextlib.contextmanager
def emulated_regions(
    path: Path | None, n_peers: int, measure: bool = True
) -> Iterator[EmulatedRegions | None]:
    """The regions of the topology file at ``path`` (None: no regions, yields None), with the RTTs
    measured through the proxy before the peers start (``measure``)."""
    if path is None:
        yield None
        return
    with EmulatedRegions(load_topology(path), n_peers) as net:
        if measure:
            net.measure()
        yield net
