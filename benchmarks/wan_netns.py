"""Emulated WAN for ``benchmarks/wan_overlap.py``: network namespaces, a bridge, veth pairs, ``tc tbf``.

Layout (all names start with ``swt``; only addresses in 10.213.0.0/24 are used)::

    netns swt-hub:  bridge swtbr  <- swth<i> (veth)          (no address, just switching)
    netns swt-n<i>: eth0 = 10.213.0.<i+1>/24 (the other end of swth<i>), lo up

Node ``i``'s link is rate-capped in both directions with a token bucket filter: on ``eth0`` inside its
namespace (what it sends) and on ``swth<i>`` in the hub (what it receives). The kernel here has no
``netem`` qdisc, so there is no added latency; ``tbf`` caps the rate only. Root is required. Nothing
outside the namespaces created here is touched.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["WanError", "Wan", "cleanup", "namespaces", "ip_of", "HUB", "PREFIX"]

HUB = "swt-hub"
PREFIX = "swt-n"
SUBNET = "10.213.0"
BRIDGE = "swtbr"


class WanError(RuntimeError):
    """A command that builds the emulated network failed (its stderr is in the message)."""


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise WanError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def namespaces() -> list[str]:
    """Names of the namespaces this module owns that exist now (leftovers of a crash included)."""
    out = _run("ip", "netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n == HUB or n.startswith(PREFIX)]


def cleanup() -> None:
    """Delete every namespace this module owns (their veths and qdiscs go with them)."""
    for ns in namespaces():
        _run("ip", "netns", "del", ns, check=False)


def ip_of(i: int) -> str:
    """The address of node ``i``."""
    return f"{SUBNET}.{i + 1}"


@dataclass
class Wan:
    """``n`` nodes on one bridge, each link capped at ``rate_mbit`` (None: uncapped).

    Use as a context manager: it removes leftovers first and always deletes its namespaces on exit.
    """

    n: int
    rate_mbit: float | None = 20.0
    burst_kbit: int = 64

    def ns(self, i: int) -> str:
        """Namespace of node ``i``."""
        return f"{PREFIX}{i}"

    def __enter__(self) -> Wan:
        if os.geteuid() != 0:
            raise WanError("network namespaces need root (euid 0)")
        if self.n < 1 or self.n > 200:
            raise WanError(f"node count {self.n} out of range 1..200")
        cleanup()
        try:
            self._build()
        except BaseException:
            cleanup()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        cleanup()

    def _tbf(self, ns: str, dev: str) -> None:
        if self.rate_mbit is None:
            return
        _run(
            "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
            "rate", f"{self.rate_mbit}mbit", "burst", f"{self.burst_kbit}kbit", "latency", "400ms",
        )  # fmt: skip

    def _build(self) -> None:
        _run("ip", "netns", "add", HUB)
        _run("ip", "-n", HUB, "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "-n", HUB, "link", "set", BRIDGE, "up")
        _run("ip", "-n", HUB, "link", "set", "lo", "up")
        for i in range(self.n):
            ns, hub_dev = self.ns(i), f"swth{i}"
            _run("ip", "netns", "add", ns)
            # create the pair inside the hub, then move one end: the root namespace is never touched
            _run("ip", "-n", HUB, "link", "add", hub_dev, "type", "veth", "peer", "name", f"swtp{i}")
            _run("ip", "-n", HUB, "link", "set", f"swtp{i}", "netns", ns)
            _run("ip", "-n", ns, "link", "set", f"swtp{i}", "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{ip_of(i)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", HUB, "link", "set", hub_dev, "master", BRIDGE)
            _run("ip", "-n", HUB, "link", "set", hub_dev, "up")
            self._tbf(ns, "eth0")
            self._tbf(HUB, hub_dev)

    def qdiscs(self, i: int) -> str:
        """``tc qdisc show`` of node ``i``'s eth0 (to record that the cap is in place)."""
        return _run("ip", "netns", "exec", self.ns(i), "tc", "qdisc", "show", "dev", "eth0").stdout.strip()

    def transfer(self, src: int, dst: int, nbytes: int, port: int = 47123) -> float:
        """Send ``nbytes`` over TCP from node ``src`` to node ``dst``; seconds until ``dst`` has them all.

        A direct check of connectivity and of the rate cap: with a cap, this takes at least about
        ``nbytes * 8 / rate`` (less the bucket's burst).
        """
        server = (
            "import socket,sys,time\n"
            "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            f"s.bind(('{ip_of(dst)}',{port}));s.listen(1);print('ready',flush=True)\n"
            "c,_=s.accept();n=0;t=time.perf_counter()\n"
            f"while n<{nbytes}:\n"
            "    b=c.recv(1<<16)\n"
            "    if not b: break\n"
            "    n+=len(b)\n"
            "print(n,time.perf_counter()-t,flush=True)\n"
        )
        client = (
            "import socket\n"
            f"c=socket.create_connection(('{ip_of(dst)}',{port}),timeout=10)\n"
            f"c.sendall(bytes({nbytes}));c.close()\n"
        )
        py = sys.executable
        srv = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(dst), py, "-c", server], stdout=subprocess.PIPE, text=True
        )
        try:
            if srv.stdout is None or srv.stdout.readline().strip() != "ready":
                raise WanError("transfer: the receiving side did not start")
            _run("ip", "netns", "exec", self.ns(src), py, "-c", client)
            out, _ = srv.communicate(timeout=60)
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.wait()
        got, secs = out.split()
        if int(got) != nbytes:
            raise WanError(f"transfer: {got} of {nbytes} bytes arrived")
        return float(secs)
