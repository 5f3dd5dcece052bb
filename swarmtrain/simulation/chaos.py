"""Chaos for ``swarmtrain simulate --chaos SPEC``: kill, preempt and restart peers while they train.

A spec is comma-separated ``key=value`` items::

    kill=2/min,preempt=1/min,restart=20s,seed=7

* ``kill=RATE``: SIGKILL a random training peer's main process (a crash; its DHT helper and p2pd
  die by the node's watchdog) RATE times per unit of time (``/s``, ``/min``, ``/h``).
* ``preempt=RATE``: SIGTERM one (a spot preemption: it leaves through the graceful path).
* ``restart=DELAY``: start a killed or preempted peer again after DELAY (``15s``, ``500ms``,
  ``1m``; a plain number is seconds) with the same identity and rank; it rejoins as a late peer and
  adopts the swarm's state from a donor. Without ``restart``, a peer that went stays gone.
* ``seed=N``: the seed of the choices (default: the run's ``train.seed``).

Faults come at random moments, one in each period of ``1/RATE`` (uniform within the period), so a run
of a given length sees the rate it asked for rather than a Poisson draw that may bring none. They start
when every peer has trained its first step and stop before the run's end (:data:`QUIET_FROM`), and a
fault never leaves fewer running peers than ``peers.min_peers`` (at least 2): a fault the run absorbs,
not one that ends it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from swarmtrain.core.errors import ConfigError, SwarmError

__all__ = ["ChaosSpec", "ChaosSchedule", "parse_chaos", "timeline_event", "QUIET_FROM", "NO_RESTART_FROM"]

#: no new fault once the furthest peer passed this fraction of the run's steps
QUIET_FROM = 0.75
#: no restart once a peer passed this fraction or finished (too late to rejoin: it may find no donor)
NO_RESTART_FROM = 0.9

_UNITS_PER_S = {"s": 1.0, "sec": 1.0, "min": 1 / 60.0, "m": 1 / 60.0, "h": 1 / 3600.0, "hour": 1 / 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*/\s*([a-z]+)\s*$")
_DELAY = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min)?\s*$")


@dataclass(frozen=True)
class ChaosSpec:
    """What ``--chaos`` asked for: faults per second of each kind and the restart delay."""

    kill_per_s: float = 0.0
    preempt_per_s: float = 0.0
    restart_s: float | None = None  # None: a peer that went stays gone
    seed: int | None = None
    text: str = ""

    def describe(self) -> str:
        """One short line: the rates per minute and the restart delay."""
        parts = []
        if self.kill_per_s:
            parts.append(f"{self.kill_per_s * 60:g} kills/min")
        if self.preempt_per_s:
            parts.append(f"{self.preempt_per_s * 60:g} preemptions/min")
        parts.append("no restart" if self.restart_s is None else f"restart after {self.restart_s:g} s")
        return ", ".join(parts)


def _rate(key: str, value: str) -> float:
    m = _RATE.match(value.lower())
    if not m or m.group(2) not in _UNITS_PER_S:
        raise ConfigError(f"--chaos {key}={value}: expected a rate such as 2/min, 1/s or 10/h")
    return float(m.group(1)) * _UNITS_PER_S[m.group(2)]


def _delay(key: str, value: str) -> float:
    m = _DELAY.match(value.lower())
    if not m:
        raise ConfigError(f"--chaos {key}={value}: expected a delay such as 15s, 500ms or 1m")
    scale = {"ms": 0.001, "s": 1.0, None: 1.0, "m": 60.0, "min": 60.0}[m.group(2)]
    return float(m.group(1)) * scale


def parse_chaos(text: str) -> ChaosSpec:
    """Parse ``kill=RATE,preempt=RATE,restart=DELAY,seed=N`` (any order, each at most once).

    Raises:
        ConfigError: one line naming the bad item (unknown key, bad rate or delay, repeated key, or
            neither a kill nor a preemption rate above zero).
    """
    values: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or not value.strip():
            raise ConfigError(f"--chaos: {item.strip()!r} is not key=value (e.g. kill=2/min,restart=15s)")
        if key not in ("kill", "preempt", "restart", "seed"):
            raise ConfigError(f"--chaos: unknown key {key!r} (use kill, preempt, restart, seed)")
        if key in values:
            raise ConfigError(f"--chaos: {key} given twice")
        values[key] = value.strip()
    kill = _rate("kill", values["kill"]) if "kill" in values else 0.0
    preempt = _rate("preempt", values["preempt"]) if "preempt" in values else 0.0
    if kill <= 0 and preempt <= 0:
        raise ConfigError("--chaos: give a kill or preempt rate above zero (e.g. kill=2/min)")
    restart = _delay("restart", values["restart"]) if "restart" in values else None
    seed = None
    if "seed" in values:
        try:
            seed = int(values["seed"])
        except ValueError:
            raise ConfigError(f"--chaos seed={values['seed']}: expected an integer") from None
    return ChaosSpec(kill, preempt, restart, seed, text.strip())


@dataclass
class ChaosSchedule:
    """When the next faults are due and whom they hit (the runner sends the signals).

    ``start(t)`` anchors the periods at ``t`` (seconds on the caller's clock): the k-th fault of a
    kind falls at a uniform moment in ``[t + k * period, t + (k + 1) * period)``. ``due(t)`` returns
    the kinds (``"kill"``, ``"preempt"``) whose moment passed, each once, and draws the next one.
    """

    spec: ChaosSpec
    seed: int
    rng: random.Random = field(init=False)
    _period: dict[str, float] = field(default_factory=dict, init=False)
    _anchor: float | None = field(default=None, init=False)
    _index: dict[str, int] = field(default_factory=dict, init=False)
    _next: dict[str, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.spec.seed if self.spec.seed is not None else self.seed)
        for kind, rate in (("kill", self.spec.kill_per_s), ("preempt", self.spec.preempt_per_s)):
            if rate > 0:
                self._period[kind] = 1.0 / rate

    @property
    def started(self) -> bool:
        return self._anchor is not None

    def start(self, t: float) -> None:
        """Anchor the periods of every kind at ``t``."""
        self._anchor = t
        for kind in self._period:
            self._index[kind] = 0
            self._draw(kind)

    def _draw(self, kind: str) -> None:
        if self._anchor is None:
            raise SwarmError("the chaos schedule was drawn from before start()")
        period = self._period[kind]
        self._next[kind] = self._anchor + period * (self._index[kind] + self.rng.random())

    def due(self, t: float) -> list[str]:
        """The kinds due at ``t`` (in time order); each is then scheduled in its next period."""
        out = []
        for kind, at in sorted(self._next.items(), key=lambda kv: kv[1]):
            if at <= t:
                out.append(kind)
                self._index[kind] += 1
                self._draw(kind)
        return out

    def pick(self, candidates: list[int]) -> int:
        """One of ``candidates`` (ranks), at random."""
        return self.rng.choice(sorted(candidates))


def timeline_event(t: float, rank: int, what: str, **extra: Any) -> dict[str, Any]:
    """One entry of the run's fault timeline (seconds since the run started, rounded to 0.1 s)."""
    return {"t": round(t, 1), "rank": rank, "event": what, **extra}
