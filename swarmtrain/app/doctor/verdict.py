"""The doctor's verdict (which role suits this machine, and why) and its output (table or JSON)."""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from swarmtrain.app.doctor.result import Check

__all__ = ["Verdict", "decide", "format_report", "report_dict", "SLOW_VS_PEERS", "SLOW_STEP_S", "WIDTH"]

#: a machine training under this share of the run's median published throughput is slow
SLOW_VS_PEERS = 0.25
#: without peer figures: a step slower than this many seconds is slow
SLOW_STEP_S = 1.0
WIDTH = 80


@dataclass(frozen=True)
class Verdict:
    """What the checks add up to.

    Attributes:
        role: ``trainer``, ``trainer (CPU)``, ``trainer (CPU, slow)``, ``relay-only``,
            ``not enough memory`` or ``cannot join`` (the p2p daemon or the run's DHT fails).
        reasons: one line each.
        exit_code: 1 when a check failed outright, else 0.
    """

    role: str
    reasons: tuple[str, ...]
    exit_code: int


def _by_name(checks: Sequence[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def _num(c: Check | None, key: str) -> float | None:
    v = None if c is None else c.data.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def decide(checks: Sequence[Check], peer_throughput: Sequence[float] = ()) -> Verdict:
    """The role that suits this machine given its checks and the run's published throughputs."""
    by = _by_name(checks)
    exit_code = int(any(c.status == "fail" for c in checks))
    reasons: list[str] = []
    daemon, dht, mem = by.get("p2p daemon"), by.get("dht"), by.get("memory")
    if daemon is not None and daemon.status == "fail":
        return Verdict("cannot join", (f"the p2p daemon does not start ({daemon.detail})",), exit_code)
    if dht is not None and dht.status == "fail":
        return Verdict("cannot join", (f"the run's DHT: {dht.detail}",), exit_code)
    reach = by.get("reachability")
    answer = str(reach.data.get("answer", "unknown")) if reach is not None else "unknown"
    cpu_fits = mem is None or bool(mem.data.get("cpu_fits"))
    gpu_fits = mem is not None and bool(mem.data.get("gpu_fits"))
    gpu, cpu = by.get("throughput cuda"), by.get("throughput cpu")
    gpu_ok = gpu_fits and gpu is not None and gpu.status == "ok"
    cpu_ok = cpu_fits and cpu is not None and cpu.status == "ok"
    if gpu_ok:
        role = "trainer"
        reasons.append(f"the model fits the GPU and trains at {gpu.figure if gpu else '-'}")
    elif cpu_ok and cpu is not None:
        role = "trainer (CPU)"
        reasons.append(f"no usable GPU; the model trains on CPU at {cpu.figure}")
        mine = _num(cpu, "tokens_per_s")
        if peer_throughput and mine is not None:
            median = statistics.median(peer_throughput)
            if mine < SLOW_VS_PEERS * median:
                role = "trainer (CPU, slow)"
                reasons.append(f"under {SLOW_VS_PEERS:.0%} of the run's median {median:,.0f} tok/s")
        elif (_num(cpu, "step_s") or 0.0) > SLOW_STEP_S:
            role = "trainer (CPU, slow)"
            reasons.append(f"a step takes over {SLOW_STEP_S:.0f} s")
    elif answer == "public":
        role = "relay-only"
        reasons.append(
            "the model does not fit or train here, but others can dial this machine: "
            "run `swarmtrain dht` as a bootstrap node"
        )
    else:
        role = "not enough memory" if not (cpu_fits or gpu_fits) else "cannot train"
        reasons.append(
            mem.detail if mem is not None and role == "not enough memory" else "no training step ran"
        )
    if answer == "behind NAT":
        reasons.append("others cannot dial this machine and no relay carries it")
    elif answer == "relayed":
        reasons.append("others reach this machine only through a relay (slower syncs)")
    elif reach is not None and reach.status != "skip" and answer == "unknown":
        reasons.append(f"reachability unknown ({reach.detail})")
    peers = by.get("peers")
    if peers is not None and peers.status == "ok":
        reasons.append(f"links to the run: {peers.detail}")
    return Verdict(role, tuple(reasons), exit_code)


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: max(n - 1, 0)] + "~"


def format_report(checks: Sequence[Check], verdict: Verdict, width: int = WIDTH) -> str:
    """A plain table of the checks (at most ``width`` columns) and the verdict below it."""
    name_w = max([len("check"), *(len(c.name) for c in checks)])
    fig_w = max([len("figure"), *(len(c.figure) for c in checks)])
    head = f"{'check':<{name_w}}  {'status':<6}  {'figure':>{fig_w}}  detail"
    lines = [head, "-" * min(width - 1, max(len(head), 60))]
    used = name_w + 2 + 6 + 2 + fig_w + 2
    indent = used if used < width - 24 else 4  # a detail too narrow to read goes under its row
    for c in checks:
        row = _cut(f"{c.name:<{name_w}}  {c.status:<6}  {c.figure:>{fig_w}}", width - 1)
        parts = textwrap.wrap(c.detail, max(width - 1 - indent, 20)) or [""]
        if indent == used:
            lines.append(f"{row}  {parts[0]}".rstrip())
            parts = parts[1:]
        else:
            lines.append(row)
        lines += [" " * indent + p for p in parts]
    lines.append("")
    lines.append(_cut(f"verdict: {verdict.role}", width - 1))
    for r in verdict.reasons:
        lines += textwrap.wrap(r, width - 1, initial_indent="  - ", subsequent_indent="    ")
    return "\n".join(lines)


def report_dict(checks: Sequence[Check], verdict: Verdict, **extra: Any) -> dict[str, Any]:
    """The ``--json`` form: checks, verdict, and ``extra`` (run ID, preset...)."""
    return {
        **extra,
        "checks": [asdict(c) for c in checks],
        "verdict": {"role": verdict.role, "reasons": list(verdict.reasons), "exit_code": verdict.exit_code},
    }
