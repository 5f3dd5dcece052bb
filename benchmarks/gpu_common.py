"""What the sections of ``benchmarks/gpu.py`` share: the run's clock, goals, bounded subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GiB = 1 << 30

__all__ = ["ROOT", "GiB", "Clock", "goal", "goals_met", "run_bounded"]


class Clock:
    """The run's time: sections start before ``budget_s``; subprocesses end before ``hard_s``."""

    def __init__(self, budget_s: float, hard_s: float) -> None:
        self.t0 = time.perf_counter()
        self.budget_s, self.hard_s = budget_s, hard_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def spent(self) -> bool:
        """No new piece of work starts after the budget."""
        return self.elapsed() > self.budget_s

    def left(self, cap: float | None = None) -> float:
        """Seconds a subprocess started now may take (at most ``cap``; at least 10)."""
        left = self.hard_s - self.elapsed()
        return max(10.0, min(left, cap) if cap is not None else left)


def goal(target: float | bool, value: Any, higher: bool = True, applies: bool = True) -> dict[str, Any]:
    """One goal: ``met`` is ``None`` when it was not measured or does not apply on this device."""
    if not applies or value is None:
        met = None
    elif isinstance(target, bool):
        met = value is target
    else:
        met = value >= target if higher else value <= target
    return {"target": target, "value": value, "met": met}


def goals_met(goals: dict[str, dict[str, Any]]) -> bool | None:
    """All goals that apply were met (``None``: none applied)."""
    mets = [g["met"] for g in goals.values() if g["met"] is not None]
    return all(mets) if mets else None


def run_bounded(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``cmd`` in its own session; past ``timeout`` interrupt its process group (SIGINT: the
    simulator stops its peers on the way out), then kill it 20 s later. Returns (exit code, stderr).

    Raises:
        subprocess.TimeoutExpired: it ran past ``timeout``.
    """
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, err
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGINT, 20.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
                proc.communicate(timeout=wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        raise
