"""A modelled wall-clock for the strategy benchmark's curves: loss against time over an emulated link.

Nothing here is measured on a network. For a link of ``bandwidth`` bits/s and round-trip time
``rtt``, the time by a curve point at local step ``s`` of a run of ``steps`` steps is modelled as

    compute + communication = s * wall_s / steps + syncs(s) * rtt + bytes(s) * 8 / bandwidth

where ``wall_s / steps`` is the run's measured in-process wall time per step (every worker of the
run shared this machine's cores, so it is this machine's figure, not one worker's on its own machine),
``bytes(s)`` is the codec payload one worker had sent by then (the curve's own figure) and
``syncs(s) = rounds_committed * s / steps`` (exact for syncs at every step or every H steps). One
round trip per sync and no overlap of communication with compute: a butterfly all-reduce needs at
least two message rounds, and Streaming DiLoCo overlaps its syncs with local steps, so this is a
lower bound on the latency part and an upper bound on Streaming DiLoCo's time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from swarmtrain.core.errors import ConfigError

__all__ = ["Link", "parse_link", "modelled_times", "NOTE"]

NOTE = (
    "modelled, not measured: compute = the run's in-process wall per step, plus one RTT per sync "
    "and the bytes one worker sent over the link's bandwidth; no overlap"
)

_RATE = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_PART = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-z]+)\s*$")


@dataclass(frozen=True)
class Link:
    """An emulated link: ``bandwidth`` in bits per second, round-trip time ``rtt`` in seconds."""

    bandwidth: float
    rtt: float

    def label(self) -> str:
        mbit = self.bandwidth / 1e6
        return f"{mbit:g} Mbit/s, {self.rtt * 1e3:g} ms RTT"

    def as_json(self) -> dict[str, Any]:
        return {"bandwidth_bit_s": self.bandwidth, "rtt_s": self.rtt, "label": self.label(), "note": NOTE}


def _number(part: str, units: Mapping[str, float], what: str, text: str) -> float:
    m = _PART.match(part.lower())
    if m is None or m.group(2) not in units:
        raise ConfigError(f"--link {text!r}: {what} {part.strip()!r} needs a unit ({', '.join(units)})")
    return float(m.group(1)) * units[m.group(2)]


def parse_link(text: str) -> Link:
    """``"100mbit,50ms"`` as a ``Link`` (bandwidth: bit/kbit/mbit/gbit per second; RTT: us/ms/s).

    Raises:
        ConfigError: not two parts, a unit missing or unknown, a bandwidth of 0 or a negative RTT.
    """
    parts = text.split(",")
    if len(parts) != 2:
        raise ConfigError(f"--link {text!r}: expected BANDWIDTH,RTT, e.g. 100mbit,50ms")
    bandwidth = _number(parts[0], _RATE, "bandwidth", text)
    rtt = _number(parts[1], _TIME, "RTT", text)
    if bandwidth <= 0:
        raise ConfigError(f"--link {text!r}: the bandwidth must be above 0")
    return Link(bandwidth, rtt)


def modelled_times(row: Mapping[str, Any], steps: int, link: Link) -> list[float]:
    """The modelled wall-clock seconds at each of ``row``'s curve points (see the module's model)."""
    per_step = float(row["wall_s"]) / steps
    syncs_per_step = float(row.get("rounds_committed") or 0.0) / steps
    return [
        c["step"] * per_step + c["step"] * syncs_per_step * link.rtt + c["bytes"] * 8.0 / link.bandwidth
        for c in row.get("curve") or ()
    ]
