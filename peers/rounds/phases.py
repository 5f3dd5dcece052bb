"""Where one collective round's time goes: wall and CPU seconds per phase, cheap enough to keep on.

A round is cut into consecutive phases by :meth:`PhaseClock.mark` (group formation, encoding and
queueing the parts, the exchange, letting the sends settle, the commit agreement); each mark books
the wall seconds (``time.perf_counter``) and the calling thread's CPU seconds (``time.thread_time``)
since the previous mark. Inside a phase, :meth:`PhaseClock.detail` sums sub-phases that alternate in
a loop (the exchange: waiting, reducing and encoding my chunks, decoding the others' aggregates).
Two clock reads per mark or sub-phase step, no logging: the collective keeps the clock on always.

What runs off the calling thread (the event loop's sends, receives and admission checks, the p2pd
daemon, the DHT process that signs and checks records) is not booked here: its CPU shows up as the
CPU of those threads and processes, which a benchmark reads per round (``benchmarks/allreduce.py``).
"""

from __future__ import annotations

import time

__all__ = ["Phases", "PhaseClock", "Stopwatch"]


class Phases(dict[str, float]):
    """Wall seconds per phase of one round, in order; the phases do not overlap, so their sum is the
    round's duration (what the collective's deadline estimate samples).

    Attributes:
        cpu: the calling thread's CPU seconds per phase (same keys).
        detail: wall seconds of sub-phases within a phase (``"exchange.wait"``...), not in the sum.
        detail_cpu: the calling thread's CPU seconds of those sub-phases.
    """

    def __init__(self) -> None:
        super().__init__()
        self.cpu: dict[str, float] = {}
        self.detail: dict[str, float] = {}
        self.detail_cpu: dict[str, float] = {}

    def flat(self) -> dict[str, dict[str, float]]:
        """``{"wall": {...}, "cpu": {...}}`` over phases and sub-phases, for a JSON report."""
        return {"wall": {**self, **self.detail}, "cpu": {**self.cpu, **self.detail_cpu}}


class PhaseClock:
    """Books wall and CPU seconds of one round's phases (see the module docstring).

    ``phases`` is the :class:`Phases` the collective exposes as ``last_timings``.
    """

    def __init__(self) -> None:
        self.phases = Phases()
        self._last = time.perf_counter()
        self._last_cpu = time.thread_time()

    def mark(self, phase: str) -> None:
        """Book the seconds since the previous mark (or the start) under ``phase``."""
        now, cpu = time.perf_counter(), time.thread_time()
        self.phases[phase] = now - self._last
        self.phases.cpu[phase] = cpu - self._last_cpu
        self._last, self._last_cpu = now, cpu

    def detail(self, name: str, wall: float, cpu: float) -> None:
        """Add ``wall`` and ``cpu`` seconds to the sub-phase ``name`` (within the current phase)."""
        self.phases.detail[name] = self.phases.detail.get(name, 0.0) + wall
        self.phases.detail_cpu[name] = self.phases.detail_cpu.get(name, 0.0) + cpu


class Stopwatch:
    """Splits a loop's time among sub-phases: ``lap(name)`` books the seconds since the previous lap
    (or the start) under ``name`` in ``clock``'s details."""

    def __init__(self, clock: PhaseClock, prefix: str) -> None:
        self.clock, self.prefix = clock, prefix
        self._last, self._last_cpu = time.perf_counter(), time.thread_time()

    def lap(self, name: str) -> None:
        """Book the time since the previous lap under ``prefix.name``."""
        now, cpu = time.perf_counter(), time.thread_time()
        self.clock.detail(f"{self.prefix}.{name}", now - self._last, cpu - self._last_cpu)
        self._last, self._last_cpu = now, cpu
