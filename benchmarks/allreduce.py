"""All-reduce round time: swarmtrain's butterfly over P2P streams vs hivemind's DecentralizedAverager.

Four peers on 127.0.0.1, each a separate process (own process group), average the same random fp32
vectors (4M and 16M elements by default) in the same run. Ours runs with the ``none`` (fp32) and
``int8`` codecs; hivemind runs with ``NoCompression`` (its 8-bit codecs do not decode with numpy >= 2.4
here, docs/architecture.md, Known traps). Round time is measured per round as the slowest peer's wall
time between a barrier and its result; we report the median over the timed rounds (after one warm-up
round). Each side runs in its own set of four processes (hivemind first, then ours), one torch thread
per peer (four peers on two cores: OpenMP spinning would otherwise dominate both sides).

* ours: the whole ``all_reduce`` call, group formation over the DHT included (``round_s``, the
  conservative figure); ``data_phase_s`` is the same round minus each peer's own group formation
  (``P2PCollective.last_timings["group"]``), the slowest peer's — the like-for-like figure.
* hivemind: matchmaking is done beforehand (``require_trigger``); only the all-reduce after the
  trigger is timed, so its ``round_s`` and ``data_phase_s`` are the same.

``ratio_vs_hivemind_fp32`` divides our ``round_s`` median by hivemind's fp32 one (group formation
charged to us only); ``data_ratio_vs_hivemind_fp32`` divides our ``data_phase_s`` median by it
(like for like). ``cpu_s_all_peers_median`` is the CPU time of one round summed over the four peers'
process trees (peer, DHT helper, p2pd, hivemind's averager): on a shared machine the wall-clock
figures move with the load (``loadavg_before``/``loadavg_after`` in the JSON), the CPU cost much less.

Every result is checked against the exact mean (max abs error in the table), and our bytes come from
the byte ledger. Prints a table and writes ``benchmarks/results/allreduce.json``; ``--append`` also
appends the run to ``allreduce_runs.json`` and rewrites that file's ``summary`` (the ranges over all
runs that the README quotes); ``--summarize`` only rewrites and prints that summary.

    python benchmarks/allreduce.py [--sizes 4M,16M] [--rounds 5] [--peers 4] [--append]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from peers.dht.process import find_orphans, spawn_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runlog import append_run, load_runs, write_json, write_report  # noqa: E402

LOOPBACK = "/ip4/127.0.0.1/tcp/0"
RESULTS = Path(__file__).resolve().parent / "results"
RUNS = RESULTS / "allreduce_runs.json"
RUNS_NOTE = (
    "runs of python benchmarks/allreduce.py --append (each: that run's allreduce.json plus when, load "
    "and commit); summary: ranges over all runs, rewritten by the script on every append"
)


def _vector(rank: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(rank))


def _expected_mean(n_peers: int, numel: int) -> torch.Tensor:
    acc = torch.zeros(numel, dtype=torch.float64)
    for r in range(n_peers):
        acc += _vector(r, numel)
    return (acc / n_peers).to(torch.float32)


def _tree_cpu() -> float:
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


def _hivemind_round(avg: Any, x: torch.Tensor, barrier: Any) -> tuple[float, torch.Tensor]:
    """One hivemind round: matchmaking first (untimed), then the timed all-reduce after a barrier."""
    from hivemind.averaging.control import AveragingStage

    with avg.get_tensors() as ts:
        ts[0].copy_(x)
    for _attempt in range(5):  # matchmaking can fail on a loaded machine; it is not timed, so retry
        control = avg.step(wait=False, require_trigger=True, timeout=120)
        end = time.monotonic() + 120
        while control.stage != AveragingStage.AWAITING_TRIGGER and not control.done():
            if time.monotonic() > end:
                raise RuntimeError("hivemind matchmaking did not finish")
            time.sleep(0.01)
        if not control.done():
            break
    else:
        raise RuntimeError("hivemind matchmaking failed 5 times")
    barrier.wait(timeout=300)
    t0 = time.perf_counter()
    control.allow_allreduce()
    group = control.result(timeout=120)
    dt = time.perf_counter() - t0
    if not group:
        raise RuntimeError("hivemind round failed")
    with avg.get_tensors() as ts:
        return dt, ts[0].clone()


def _worker(
    rank: int,
    initial: list[str],
    q: Any,
    barrier: Any,
    n: int,
    sizes: list[int],
    codecs: list[str],
    rounds: int,
    impl: str,
    chunk_elems: int,
) -> None:
    """One peer: per size, ``rounds + 1`` rounds of hivemind's averager or of ours (every codec)."""
    import logging

    import hivemind
    from hivemind.compression import NoCompression

    from compression import build_compressor
    from peers import P2PCollective, PeerNode
    from swarmtrain.core.config import CompressionConfig, PeersConfig

    logging.basicConfig(
        level=os.environ.get("BENCH_LOG", "WARNING"), format="%(process)d %(name)s: %(message)s"
    )
    torch.set_num_threads(1)  # 4 peers on 2 shared cores: OpenMP spinning would dominate both sides
    mp.set_start_method("fork", force=True)  # hivemind's averager is a default-context mp.Process
    with PeerNode(PeersConfig(run_id="bench-ar", initial_peers=initial, host_maddrs=[LOOPBACK])) as node:
        q.put(("ready", rank, node.visible_maddrs))
        node.wait_for_peers(n, timeout=120)
        comps = {c: build_compressor(CompressionConfig(codec=c)) for c in codecs}
        coll = P2PCollective(node, min_peers=n, expected_peers=n, chunk_elems=chunk_elems)
        for numel in sizes:
            x = _vector(rank, numel)
            expected = _expected_mean(n, numel)
            keys = ["hivemind"] if impl == "hivemind" else list(codecs)
            stats: dict[str, dict[str, Any]] = {
                k: {"times": [], "cpu": [], "sent": [], "group": [], "phases": [], "err": float("nan")}
                for k in keys
            }
            avg = None
            if impl == "hivemind":
                avg = hivemind.averaging.DecentralizedAverager(
                    [x.clone()],
                    node.dht,
                    start=True,
                    prefix=f"bench{numel}",
                    target_group_size=n,
                    min_group_size=n,
                    min_matchmaking_time=3.0,
                    request_timeout=1.0,
                    compression=NoCompression(),
                )
            for i in range(rounds + 1):
                if avg is not None:
                    cpu0 = _tree_cpu()
                    dt, out = _hivemind_round(avg, x, barrier)
                    cpu = _tree_cpu() - cpu0
                    st = stats["hivemind"]
                    if i == 0:
                        st["err"] = float((out - expected).abs().max())
                    else:
                        st["times"].append(dt)
                        st["cpu"].append(cpu)
                    continue
                for codec, comp in comps.items():
                    cpu0 = _tree_cpu()
                    barrier.wait(timeout=300)
                    t0 = time.perf_counter()
                    res = coll.all_reduce({"x": x}, compressor=comp, timeout=120)
                    dt = time.perf_counter() - t0
                    cpu = _tree_cpu() - cpu0
                    st = stats[codec]
                    if not res.committed:  # counted and shown, never hidden; the next round re-forms
                        st.setdefault("failed", []).append(res.reason[:120])
                        continue
                    if i == 0:
                        st["err"] = float((res.tensors["x"] - expected).abs().max())
                    else:
                        st["times"].append(dt)
                        st["cpu"].append(cpu)
                        st["sent"].append(res.bytes_sent)
                        st["group"].append(coll.last_timings.get("group", 0.0))
                        st["phases"].append(dict(coll.last_timings))
            if avg is not None:
                avg.shutdown()
            for key, st in stats.items():
                q.put(
                    (
                        "result",
                        rank,
                        {
                            "impl": "hivemind" if key == "hivemind" else "swarmtrain",
                            "codec": "none" if key == "hivemind" else key,
                            "numel": numel,
                            "times": st["times"],
                            "cpu": st["cpu"],
                            "bytes_sent": statistics.median(st["sent"]) if st["sent"] else None,
                            "max_abs_err": st["err"],
                            "group_s": st["group"],
                            "phases": st["phases"],
                            "failed": st.get("failed", []),
                        },
                    )
                )
        q.put(("done", rank, None))


def _guarded(target: Any, rank: int, initial: list[str], q: Any, *args: Any) -> None:
    import traceback

    try:
        target(rank, initial, q, *args)
    except BaseException:
        q.put(("error", rank, traceback.format_exc()[-3000:]))
        raise


def next_report(q: Any, procs: list[Any], timeout: float) -> tuple[str, int, Any]:
    """Next report; raises if it does not come in time or a worker died."""
    import queue as queue_mod

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            tag, rank, payload = q.get(timeout=1.0)
        except queue_mod.Empty:
            dead = [p.pid for p in procs if not p.alive]
            if dead:
                raise RuntimeError(f"worker processes {dead} died") from None
            continue
        if tag == "error":
            raise RuntimeError(f"peer {rank} failed:\n{payload}")
        return tag, rank, payload
    raise TimeoutError("no report from the peers in time")


def _run(
    target: Any, n: int, sizes: list[int], codecs: list[str], rounds: int, impl: str, chunk_elems: int
) -> list[dict[str, Any]]:
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(n)
    procs = []
    try:
        args = (n, sizes, codecs, rounds, impl, chunk_elems)
        procs.append(spawn_function(_guarded, (target, 0, [], q, barrier, *args)))
        tag, _, boot = next_report(q, procs, 180)
        for r in range(1, n):
            procs.append(spawn_function(_guarded, (target, r, list(boot), q, barrier, *args)))
        per: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
        done = 0
        while done < n:
            tag, rank, payload = next_report(q, procs, 900)
            if tag == "result":
                per.setdefault((payload["impl"], payload["codec"], payload["numel"]), {})[rank] = payload
            elif tag == "done":
                done += 1
        out = []
        for (_impl, codec, numel), by_rank in per.items():
            rows = list(by_rank.values())
            n_ok = min(len(r["times"]) for r in rows)
            rounds_max = [max(r["times"][i] for r in rows) for i in range(n_ok)] or [float("nan")]
            sent = [r["bytes_sent"] for r in rows if r["bytes_sent"] is not None]
            # the round minus this peer's group formation (comparable to hivemind's post-trigger time)
            data_only = [
                max(r["times"][i] - (r["group_s"][i] if r["group_s"] else 0.0) for r in rows)
                for i in range(n_ok)
            ] or [float("nan")]
            out.append(
                {
                    "impl": rows[0]["impl"],
                    "codec": codec,
                    "numel": numel,
                    "peers": n,
                    "round_s_median": statistics.median(rounds_max),
                    "round_s_min": min(rounds_max),
                    "round_s_max": max(rounds_max),
                    "round_s_all": rounds_max,
                    "data_phase_s_median": statistics.median(data_only),
                    # CPU seconds of one round summed over every peer's process tree (peer, DHT
                    # process, p2pd, hivemind's averager): what the round costs the machine
                    "cpu_s_all_peers_median": statistics.median(
                        [sum(r["cpu"][i] for r in rows) for i in range(n_ok)] or [float("nan")]
                    ),
                    "bytes_sent_per_peer": statistics.mean(sent) if sent else None,
                    "max_abs_err": max(r["max_abs_err"] for r in rows),
                    "failed_rounds": max(len(r["failed"]) for r in rows),
                    "failure_reasons": sorted({x for r in rows for x in r["failed"]})[:5],
                    # per phase of P2PCollective.last_timings: median over every peer and timed round
                    "phase_s_median": {
                        k: statistics.median(ph[k] for r in rows for ph in r.get("phases", []) if k in ph)
                        for k in sorted({k for r in rows for ph in r.get("phases", []) for k in ph})
                    },
                }
            )
        return out
    finally:
        for p in procs:
            p.terminate(grace=5.0)
        left = [o.pid for p in procs for o in find_orphans(p.marker)]
        if left:
            print(f"warning: leftover processes {left}", file=sys.stderr)


def _parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KM" else s) * mult)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4M,16M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--codecs", default="none,int8")
    ap.add_argument("--chunk-elems", type=int, default=1 << 20, help="our elements per packet/frame")
    ap.add_argument("--only-ours", action="store_true", help="skip hivemind (quick experiments)")
    ap.add_argument("--json", default=str(RESULTS / "allreduce.json"))
    ap.add_argument(
        "--append", action="store_true", help=f"also append this run to {RUNS.name} and update its summary"
    )
    ap.add_argument("--runs-json", default=str(RUNS), help="the run series --append extends")
    ap.add_argument("--summarize", action="store_true", help="only rewrite and print the series summary")
    args = ap.parse_args(argv)
    if args.summarize:
        summary = write_summary(Path(args.runs_json))
        print(format_summary(summary))
        return 0
    sizes = [_parse_size(s) for s in args.sizes.split(",")]
    codecs = args.codecs.split(",")
    t0 = time.time()
    load_before = os.getloadavg()
    ce = args.chunk_elems
    rows = [] if args.only_ours else _run(_worker, args.peers, sizes, codecs, args.rounds, "hivemind", ce)
    rows += _run(_worker, args.peers, sizes, codecs, args.rounds, "swarmtrain", ce)
    base = {r["numel"]: r["round_s_median"] for r in rows if r["impl"] == "hivemind"}
    for r in rows:
        hm = base.get(r["numel"])
        r["ratio_vs_hivemind_fp32"] = r["round_s_median"] / hm if hm else None
        r["data_ratio_vs_hivemind_fp32"] = r["data_phase_s_median"] / hm if hm else None
    rows.sort(key=lambda r: (r["numel"], r["impl"] != "hivemind", r["codec"]))
    out = {
        "benchmark": "allreduce",
        "peers": args.peers,
        "rounds": args.rounds,
        "chunk_elems": ce,
        "wall_s": time.time() - t0,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "rows": rows,
    }
    table = [
        *_table(rows),
        f"load average (1/5/15 min) before {out['loadavg_before']}, after {out['loadavg_after']}",
    ]
    write_report(Path(args.json), out, table)
    if args.append:
        entry = append_run(Path(args.runs_json), "allreduce", out, note=RUNS_NOTE)
        summary = write_summary(Path(args.runs_json))
        print(f"appended run {entry['run']} to {args.runs_json}")
        print(format_summary(summary))
    return 0


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per implementation, codec and size, then each row's phase medians."""
    lines = [
        f"{'impl':<11} {'codec':<6} {'elements':>9} {'median s':>9} {'min s':>7} {'max s':>7} "
        f"{'data s':>7} {'cpu s':>6} {'MiB sent/peer':>13} {'x hivemind':>10} {'data x hm':>9} "
        f"{'max|err|':>9} {'failed':>6}"
    ]
    for r in rows:
        mib = f"{r['bytes_sent_per_peer'] / 2**20:.1f}" if r["bytes_sent_per_peer"] else "-"
        lines.append(
            f"{r['impl']:<11} {r['codec']:<6} {r['numel'] / 2**20:>8.0f}M {r['round_s_median']:>9.3f} "
            f"{r['round_s_min']:>7.3f} {r['round_s_max']:>7.3f} {r['data_phase_s_median']:>7.3f} "
            f"{r['cpu_s_all_peers_median']:>6.2f} {mib:>13} "
            f"{r['ratio_vs_hivemind_fp32'] or float('nan'):>10.2f} "
            f"{r['data_ratio_vs_hivemind_fp32'] or float('nan'):>9.2f} "
            f"{r['max_abs_err']:>9.2e} {r['failed_rounds']:>6}"
        )
    for r in rows:
        if r.get("phase_s_median"):
            ph = " ".join(f"{k}={v:.3f}" for k, v in r["phase_s_median"].items())
            lines.append(f"  phases {r['codec']:<5} {r['numel'] / 2**20:.0f}M: {ph}")
    return lines


def _span(values: list[float]) -> list[float] | None:
    vals = [float(v) for v in values if v is not None]
    return [round(min(vals), 3), round(max(vals), 3)] if vals else None


def series_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Ranges over ``runs`` (each an ``allreduce.json`` payload) per (elements, implementation, codec):
    round time median, like-for-like data phase, ratios to hivemind fp32, CPU seconds per round."""
    cells: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for r in run.get("rows", []):
            key = f"{r['impl']} {r['codec']} {r['numel'] // 2**20}M"
            c = cells.setdefault(key, {})
            for field in (
                "round_s_median",
                "data_phase_s_median",
                "ratio_vs_hivemind_fp32",
                "data_ratio_vs_hivemind_fp32",
                "cpu_s_all_peers_median",
            ):
                c.setdefault(field, []).append(r.get(field))
    load = [run["loadavg_before"][0] for run in runs if run.get("loadavg_before")]
    load += [run["loadavg_after"][0] for run in runs if run.get("loadavg_after")]
    return {
        "runs": len(runs),
        "run_numbers": [run.get("run") for run in runs],
        "loadavg_1min_range": _span(load),
        "ranges": {k: {f: _span(v) for f, v in c.items()} for k, c in sorted(cells.items())},
    }


def write_summary(path: Path) -> dict[str, Any]:
    """Recompute the summary of the series at ``path`` from its runs and store it in the file."""
    data = load_runs(path, "allreduce", RUNS_NOTE)
    data["summary"] = series_summary(data["runs"])
    write_json(path, data, indent=1)
    summary: dict[str, Any] = data["summary"]
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as a table: ``lo-hi`` over the runs for each figure."""

    def cell(v: list[float] | None) -> str:
        return "-" if not v else f"{v[0]:.2f}-{v[1]:.2f}"

    lines = [
        f"over {summary['runs']} runs (load 1 min {cell(summary['loadavg_1min_range'])}):",
        f"{'cell':<22} {'round s':>11} {'data s':>11} {'x hm fp32':>11} {'data x hm':>11} {'cpu s':>11}",
    ]
    for key, f in summary["ranges"].items():
        lines.append(
            f"{key:<22} {cell(f.get('round_s_median')):>11} {cell(f.get('data_phase_s_median')):>11} "
            f"{cell(f.get('ratio_vs_hivemind_fp32')):>11} {cell(f.get('data_ratio_vs_hivemind_fp32')):>11} "
            f"{cell(f.get('cpu_s_all_peers_median')):>11}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
