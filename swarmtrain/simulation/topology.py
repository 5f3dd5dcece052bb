"""Region topologies for ``swarmtrain simulate --topology FILE.toml``: the file's schema and the
address plan that places a bootstrap node and N peers in those regions.

A topology names regions, the round-trip time between two peers of one region (``rtt_ms``), the
round-trip time between every pair of regions (``[[links]]``) and each peer's access rate
(``rate_mbit``, both directions). Peers go to the regions round-robin in file order (peer ``r`` to
region ``r mod k``); the bootstrap node to ``bootstrap_region`` (default: the first). RTTs are what
``ping`` would show; the delay proxy adds half of one to each direction. Example
(``examples/topologies/three_regions.toml``)::

    rate_mbit = 50

    [[regions]]
    name = "us-east"
    rtt_ms = 10

    [[regions]]
    name = "eu-west"
    rtt_ms = 10

    [[links]]
    between = ["us-east", "eu-west"]
    rtt_ms = 80

The address plan (pure; ``swarmtrain.simulation.regions`` builds it): node ``i`` (0 the bootstrap,
``r + 1`` peer ``r``) lives in namespace ``swr-n<i>`` with address ``10.214.0.<i+1>/32``; the hub
namespace holds the bridge (``10.214.0.254``), the delay proxy's listening address for node ``i``,
``10.214.1.<i+1>``, which node ``i`` announces to the swarm, and the proxy's source address for
connections from node ``i``, ``10.214.2.<i+1>``. Nodes reach each other only through the proxy.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from swarmtrain.core.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "Region",
    "Link",
    "Topology",
    "Node",
    "AddressPlan",
    "load_topology",
    "parse_topology",
    "PREFIX",
    "P2P_PORT",
    "MAX_NODES",
]

#: every namespace and interface the regions create starts with this (see ``netns.Fabric``)
PREFIX = "swr"
#: the private /16 the regions use: .0 nodes and the hub's bridge, .1 proxy listeners, .2 proxy sources
NET = "10.214"
HUB_IP = f"{NET}.0.254"
#: the TCP port every peer's p2pd listens on (one peer per namespace, so one port serves all)
P2P_PORT = 41000
#: a bootstrap node plus peers; addresses .1 .. .200 of each /24
MAX_NODES = 200


class Region(BaseModel):
    """One region: its name, the RTT between two of its peers, and optionally its own access rate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$")
    rtt_ms: float = Field(default=0.0, ge=0.0, le=10_000.0)
    rate_mbit: float | None = Field(default=None, gt=0.0, le=100_000.0)


class Link(BaseModel):
    """The RTT between two different regions (one entry per pair, either order)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    between: tuple[str, str]
    rtt_ms: float = Field(ge=0.0, le=10_000.0)


class Topology(BaseModel):
    """A whole topology file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rate_mbit: float | None = Field(default=50.0, gt=0.0, le=100_000.0)
    burst_kbit: int = Field(default=64, ge=8, le=1_000_000)
    bootstrap_region: str | None = None
    regions: list[Region] = Field(min_length=1, max_length=64)
    links: list[Link] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Topology:
        names = [r.name for r in self.regions]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"region names repeat: {', '.join(dup)}")
        if self.bootstrap_region is not None and self.bootstrap_region not in names:
            raise ValueError(f"bootstrap_region {self.bootstrap_region!r} is not a region")
        seen: set[frozenset[str]] = set()
        for link in self.links:
            a, b = link.between
            for x in (a, b):
                if x not in names:
                    raise ValueError(f"link {a}-{b}: {x!r} is not a region")
            if a == b:
                raise ValueError(f"link {a}-{b}: a region's own RTT is its rtt_ms, not a link")
            pair = frozenset((a, b))
            if pair in seen:
                raise ValueError(f"link {a}-{b} is given twice")
            seen.add(pair)
        missing = [
            f"{a}-{b}" for i, a in enumerate(names) for b in names[i + 1 :] if frozenset((a, b)) not in seen
        ]
        if missing:
            raise ValueError(f"no [[links]] entry for {', '.join(missing)}")
        return self

    def rtt_ms(self, a: str, b: str) -> float:
        """The RTT between a peer in region ``a`` and one in region ``b``."""
        if a == b:
            return next(r.rtt_ms for r in self.regions if r.name == a)
        return next(link.rtt_ms for link in self.links if set(link.between) == {a, b})

    def rate_of(self, region: str) -> float | None:
        """A peer's access rate in ``region`` (Mbit/s; None: uncapped)."""
        own = next(r.rate_mbit for r in self.regions if r.name == region)
        return own if own is not None else self.rate_mbit


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(x) for x in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def parse_topology(data: dict[str, Any], source: str = "topology") -> Topology:
    """Validate a parsed topology.

    Raises:
        ConfigError: one line naming the file and the first problem.
    """
    try:
        return Topology.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"{source}: {_first_error(e)}") from None


def load_topology(path: Path | str) -> Topology:
    """Read and validate a topology TOML file.

    Raises:
        ConfigError: one line: the file is missing, not TOML, or breaks the schema.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"topology {p}: cannot read it ({e.strerror or e})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"topology {p}: not valid TOML ({e})") from None
    return parse_topology(data, f"topology {p}")


@dataclass(frozen=True)
class Node:
    """One emulated machine: the bootstrap (``rank`` -1) or a peer, where it is and its addresses."""

    index: int
    rank: int
    region: str
    ns: str
    ip: str  # its own address (eth0, /32)
    proxy_ip: str  # where the others reach it (the proxy's listener; what it announces)
    source_ip: str  # the proxy's source address for connections this node opens
    rate_mbit: float | None

    @property
    def host_maddr(self) -> str:
        """What its p2pd listens on."""
        return f"/ip4/{self.ip}/tcp/{P2P_PORT}"

    @property
    def announce_maddr(self) -> str:
        """What it tells the swarm (the proxy's address for it)."""
        return f"/ip4/{self.proxy_ip}/tcp/{P2P_PORT}"


@dataclass(frozen=True)
class AddressPlan:
    """Where the bootstrap and each of ``n_peers`` peers go, and the delay between any two."""

    topology: Topology
    n_peers: int

    def __post_init__(self) -> None:
        if not 1 <= self.n_peers <= MAX_NODES - 1:
            raise ConfigError(f"--topology supports 1..{MAX_NODES - 1} peers, not {self.n_peers}")

    @property
    def nodes(self) -> list[Node]:
        """Node 0 is the bootstrap, node ``r + 1`` peer ``r``."""
        regions = [r.name for r in self.topology.regions]
        boot = self.topology.bootstrap_region or regions[0]
        placed = [boot] + [regions[r % len(regions)] for r in range(self.n_peers)]
        return [
            Node(
                index=i,
                rank=i - 1,
                region=reg,
                ns=f"{PREFIX}-n{i}",
                ip=f"{NET}.0.{i + 1}",
                proxy_ip=f"{NET}.1.{i + 1}",
                source_ip=f"{NET}.2.{i + 1}",
                rate_mbit=self.topology.rate_of(reg),
            )
            for i, reg in enumerate(placed)
        ]

    def node_of_rank(self, rank: int) -> Node:
        """The node of peer ``rank`` (-1: the bootstrap)."""
        return self.nodes[rank + 1]

    def one_way_s(self, src: int, dst: int) -> float:
        """The delay the proxy adds to bytes from node ``src`` to node ``dst`` (half the RTT)."""
        nodes = self.nodes
        return self.topology.rtt_ms(nodes[src].region, nodes[dst].region) / 2000.0

    def hub_addrs(self) -> list[str]:
        """The addresses the hub namespace carries: the proxy's listeners and source addresses."""
        return [f"{n.proxy_ip}/32" for n in self.nodes] + [f"{n.source_ip}/32" for n in self.nodes]

    def routes(self) -> list[str]:
        """Prefixes every node reaches through the hub (the proxy's listener and source ranges)."""
        return [f"{NET}.1.0/24", f"{NET}.2.0/24"]

    def describe(self) -> str:
        """One line: regions with their peers, the RTT range, the rate."""
        per: dict[str, list[int]] = {r.name: [] for r in self.topology.regions}
        for n in self.nodes[1:]:
            per[n.region].append(n.rank)
        regions = "; ".join(f"{k}: peers {', '.join(map(str, v)) or '-'}" for k, v in per.items())
        rtts = [self.topology.rtt_ms(a.region, b.region) for a in self.nodes for b in self.nodes if a != b]
        rate = self.topology.rate_mbit
        cap = f"{rate:g} Mbit/s per peer" if rate is not None else "uncapped"
        return f"regions {regions}; RTT {min(rtts, default=0):g}-{max(rtts, default=0):g} ms; {cap}"
