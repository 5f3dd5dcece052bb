"""Where an all-reduce round of ``benchmarks/allreduce.py`` spends its time and CPU, per phase.

Two views of one round, both per peer, medians over the peers and the timed rounds:

* the calling thread's phases (``peers.rounds.phases``: ``P2PCollective.last_timings``), wall and CPU
  seconds: ``group`` (group formation over the DHT: records written, signed and read),
  ``encode_parts`` (encode my slices of the others' partitions and queue them), ``exchange`` with its
  sub-phases ``exchange.wait`` (waiting for parts and aggregates), ``exchange.reduce_send_aggs``
  (reduce my complete chunks, encode each aggregate once and queue it to every member),
  ``exchange.decode_aggs`` (decode the others' aggregates into the result), ``wait_sends`` (the queued
  sends settling) and ``agree`` (the commit agreement);
* CPU seconds of what runs beside it (:class:`CpuSampler`): ``loop_thread`` (the peer's event loop:
  every frame sent and received, the admission check of each stream), ``other_threads`` of the peer
  process, ``p2pd`` (the libp2p daemon moving the bytes) and ``dht_process`` (hivemind's DHT
  process, where every DHT record is signed on store and its signature checked on read). The
  admission checks' own wall time is summed by wrapping the node's ``admitted.acheck``
  (:func:`time_admission`): a cached answer costs microseconds, a DHT read milliseconds.

Clock reads per round and per phase only: no per-message logging.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

__all__ = [
    "CpuSampler",
    "time_admission",
    "phase_medians",
    "phase_lines",
    "plot_phases",
    "markdown_table",
    "PHASE_ORDER",
]

#: the calling thread's phases and sub-phases, in round order (sub-phases after their phase)
PHASE_ORDER = (
    "group",
    "encode_parts",
    "exchange",
    "exchange.wait",
    "exchange.reduce_send_aggs",
    "exchange.decode_aggs",
    "wait_sends",
    "agree",
)
PARTS = ("caller_thread", "loop_thread", "other_threads", "p2pd", "dht_process")


class CpuSampler:
    """Cumulative CPU seconds of this peer's parts (see the module docstring); :meth:`delta` of two
    samples is one round's."""

    def __init__(self, loop_thread_prefix: str = "swarmtrain-p2p") -> None:
        import psutil

        self._me = psutil.Process()
        self._caller = threading.get_native_id()
        loops = [t for t in threading.enumerate() if t.name.startswith(loop_thread_prefix)]
        self._loops = {t.native_id for t in loops if t.native_id is not None}

    def sample(self) -> dict[str, float]:
        """CPU seconds used so far by each part."""
        import psutil

        out = dict.fromkeys(PARTS, 0.0)
        for t in self._me.threads():
            part = (
                "caller_thread"
                if t.id == self._caller
                else "loop_thread"
                if t.id in self._loops
                else "other_threads"
            )
            out[part] += t.user_time + t.system_time
        for child in self._me.children(recursive=True):
            try:
                name, times = child.name(), child.cpu_times()
            except psutil.Error:
                continue
            out["p2pd" if "p2pd" in name else "dht_process"] += times.user + times.system
        return out

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        """One round's CPU seconds per part (a child that exited between the samples counts 0)."""
        return {k: max(after[k] - before[k], 0.0) for k in PARTS}


def time_admission(node: Any) -> dict[str, float]:
    """Wrap ``node.admitted.acheck`` to sum its wall seconds and calls into the returned dict (this
    process only, for the benchmark: the library is not changed)."""
    totals = {"admission_wall_s": 0.0, "admission_calls": 0.0}
    admitted = node.admitted
    inner = admitted.acheck

    async def acheck(peer_id: str) -> bool:
        t0 = time.perf_counter()
        try:
            return bool(await inner(peer_id))
        finally:
            totals["admission_wall_s"] += time.perf_counter() - t0
            totals["admission_calls"] += 1

    admitted.acheck = acheck
    return totals


def tree_cpu() -> float:
    """CPU seconds (user + system) used so far by this process and all its descendants (the DHT
    process, its p2pd daemon and, for hivemind, the averager process)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def phase_medians(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over ``samples`` (one per peer and timed round: ``{"wall": {...}, "cpu": {...},
    "parts": {...}, "admission": {...}}``) of every phase's wall and CPU seconds and every part's CPU."""

    def med(section: str, key: str) -> float | None:
        return _median([s[section][key] for s in samples if key in s.get(section, {})])

    names = [p for p in PHASE_ORDER if any(p in s.get("wall", {}) for s in samples)]
    names += sorted({k for s in samples for k in s.get("wall", {})} - set(names))
    adm = sorted({k for s in samples for k in s.get("admission", {})})
    return {
        "wall_s": {p: med("wall", p) for p in names},
        "cpu_s": {p: med("cpu", p) for p in names},
        "cpu_s_by_part": {p: med("parts", p) for p in PARTS},
        "admission": {k: med("admission", k) for k in adm},
        "samples": len(samples),
    }


def phase_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Table lines: per row, each phase's wall / CPU seconds, then each part's CPU seconds."""
    lines = []
    for r in rows:
        ph = r.get("phases")
        if not ph:
            continue
        head = f"  {r['codec']:<5} {r['numel'] / 2**20:g}M"
        cells = [f"{p}={ph['wall_s'][p]:.3f}/{ph['cpu_s'].get(p) or 0:.3f}" for p in ph["wall_s"]]
        lines.append(f"{head} phases wall/cpu s: " + " ".join(cells))
        parts = " ".join(f"{p}={v:.3f}" for p, v in ph["cpu_s_by_part"].items() if v is not None)
        adm = ph.get("admission", {})
        lines.append(
            f"{head} cpu s per part: {parts}; admission checks {adm.get('admission_calls') or 0:.0f} "
            f"calls, {adm.get('admission_wall_s') or 0:.4f} s"
        )
    return lines


def plot_phases(doc: dict[str, Any], path: Path) -> None:
    """Two panels per measured row of ours: the calling thread's phases (wall seconds, stacked; the
    exchange split into its sub-phases) and one round's CPU seconds per part of the peer."""
    from runlog import pyplot, save_figure

    rows = [r for r in doc["rows"] if r.get("phases")]
    if not rows:
        return
    plt = pyplot()
    fig, (ax_w, ax_c) = plt.subplots(1, 2, figsize=(13, 2.2 + 0.6 * len(rows)))
    labels = [f"{r['codec']} {r['numel'] / 2**20:g}M" for r in rows]
    wall_phases = [p for p in PHASE_ORDER if p != "exchange"]
    colors = plt.get_cmap("tab10")
    for ax, keys, get, title in (
        (ax_w, wall_phases, lambda r, k: r["phases"]["wall_s"].get(k), "wall s per round (calling thread)"),
        (ax_c, list(PARTS), lambda r, k: r["phases"]["cpu_s_by_part"].get(k), "CPU s per round, one peer"),
    ):
        left = [0.0] * len(rows)
        for j, k in enumerate(keys):
            vals = [get(r, k) or 0.0 for r in rows]
            ax.barh(labels, vals, left=left, label=k, color=colors(j))
            left = [a + b for a, b in zip(left, vals, strict=True)]
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4)
        ax.invert_yaxis()
    fig.suptitle(f"all-reduce round by phase, {doc['peers']} peers on loopback (medians)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def markdown_table(doc: dict[str, Any]) -> str:
    """``allreduce.json``'s rows of ours by phase (docs/benchmarks.md): wall seconds of the calling
    thread's phases, then one round's CPU seconds per part of one peer (medians)."""
    cols = ["group", "encode_parts", "exchange.wait", "exchange.reduce_send_aggs", "exchange.decode_aggs"]
    cols += ["wait_sends", "agree"]
    head = ["setup", "round s", *[c.removeprefix("exchange.") for c in cols], "CPU s: caller"]
    head += ["event loop", "p2pd", "DHT process"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in doc["rows"]:
        ph = r.get("phases")
        if not ph:
            continue
        name = "fp32" if r["codec"] == "none" else r["codec"]
        cells = [f"ours, {name}, {r['numel'] / 2**20:g}M", f"{r['round_s_median']:.3f}"]
        cells += [f"{ph['wall_s'].get(c) or 0:.3f}" for c in cols]
        parts = ph["cpu_s_by_part"]
        cells += [f"{parts.get(p) or 0:.3f}" for p in ("caller_thread", "loop_thread", "p2pd", "dht_process")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
