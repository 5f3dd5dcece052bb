"""All-reduce round time: swarmtrain's butterfly over P2P streams vs hivemind's DecentralizedAverager.

Four peers on 127.0.0.1, each a separate process (own process group), average the same random fp32
vectors (4M and 16M elements by default) in the same run, so the ratio to hivemind is always measured
in one run. Ours runs with the ``none`` (fp32) and ``int8`` codecs; hivemind runs with
``NoCompression`` (its 8-bit codecs do not decode with numpy >= 2.4 here, docs/architecture.md, Known
traps). Round time is measured per round as the slowest peer's wall time between a barrier and its
result; we report the median over the timed rounds every peer finished (after one warm-up round).
Each side runs in its own set of four processes (hivemind first, then ours), one torch thread per
peer (four peers on two cores: OpenMP spinning would otherwise dominate both sides).

* ours: the whole ``all_reduce`` call, group formation over the DHT included (``round_s``, the
  conservative figure); ``data_phase_s`` is the same round minus each peer's own group formation
  (``P2PCollective.last_timings["group"]``), the slowest peer's — the like-for-like figure.
* hivemind (``allreduce_hivemind``): hivemind.Optimizer's matchmaking settings; matchmaking is done
  beforehand (``require_trigger``), agreed among the peers (all grouped, or all retry: counted in
  ``matchmaking_retries``); only the all-reduce after the trigger is timed.

A failed round is recorded (``failed_rounds``, ``failure_reasons``), never raised; a side that breaks
off (a peer died, no report in time) is recorded in ``sides`` with its one-line reason and the run
keeps what it measured: it exits 0 with whatever was measured, 1 (one line) only when nothing was.

``ratio_vs_hivemind_fp32`` divides our ``round_s`` median by hivemind's fp32 one (group formation
charged to us only); ``data_ratio_vs_hivemind_fp32`` divides our ``data_phase_s`` median by it
(like for like). ``cpu_s_all_peers_median`` is the CPU time of one round summed over the four peers'
process trees (peer, DHT helper, p2pd, hivemind's averager): on a shared machine the wall-clock
figures move with the load (``recorded.loadavg``, ``loadavg_after``), the CPU cost much less.
``phases`` (ours) is the round by phase, wall and CPU seconds, and one round's CPU per part of a peer
(``allreduce_phases``); ``allreduce.png`` draws it.

Every result is checked against the exact mean (max abs error in the table), and our bytes come from
the byte ledger. Prints a table and writes ``benchmarks/results/allreduce.json`` and its figure;
``--append`` also appends the run to ``allreduce_runs.json`` and rewrites that file's ``summary`` (the
ranges over all runs that the README quotes); ``--summarize`` only rewrites and prints that summary.

    python benchmarks/allreduce.py [--sizes 4M,16M] [--rounds 5] [--peers 4] [--append]
"""

from __future__ import annotations

import argparse
import faulthandler
import multiprocessing as mp
import os
import platform
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from peers.dht.process import find_orphans, process_context, spawn_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from allreduce_hivemind import MATCHMAKING_S  # noqa: E402
from allreduce_phases import phase_lines, plot_phases, tree_cpu  # noqa: E402
from runlog import append_run, load_runs, recorded, write_json, write_report  # noqa: E402

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


def _stats() -> dict[str, Any]:
    """One (implementation, codec, size)'s per-round records of one peer; ``None`` marks a failed round."""
    return {"times": [], "cpu": [], "sent": [], "group": [], "phases": [], "err": float("nan"),
            "failed": [], "retries": 0}  # fmt: skip


def _hivemind_size(
    dht: Any, rank: int, x: torch.Tensor, expected: torch.Tensor, sync: tuple[Any, Any], cfg: dict[str, Any]
) -> dict[str, Any]:
    """``rounds + 1`` rounds of hivemind's averager on ``x`` (the first a warm-up)."""
    from allreduce_hivemind import Averagers, hivemind_round

    barrier, votes = sync
    st = _stats()
    avgs = Averagers(x, dht, f"bench{x.numel()}", cfg["n"], cfg["matchmaking_s"])
    try:
        for i in range(cfg["rounds"] + 1):
            cpu0 = tree_cpu()
            hr = hivemind_round(avgs, x, barrier, votes, rank)
            cpu = tree_cpu() - cpu0
            st["retries"] += hr.retries
            if hr.failure:
                st["failed"].append(hr.failure)
            if i == 0:
                st["err"] = float((hr.out - expected).abs().max()) if hr.out is not None else float("nan")
            else:
                st["times"].append(hr.seconds)
                st["cpu"].append(cpu)
    finally:
        avgs.shutdown()
    return {"hivemind": st}


def _ours_size(
    coll: Any,
    x: torch.Tensor,
    expected: torch.Tensor,
    barrier: Any,
    comps: dict[str, Any],
    cfg: dict[str, Any],
) -> dict[str, Any]:
    """``rounds + 1`` rounds of our all-reduce per codec on ``x`` (the first a warm-up), with each
    round's phases (``allreduce_phases``)."""
    from allreduce_phases import CpuSampler

    sampler, adm = cfg["sampler"], cfg["admission"]
    stats = {c: _stats() for c in comps}
    for i in range(cfg["rounds"] + 1):
        for codec, comp in comps.items():
            st = stats[codec]
            cpu0, parts0, adm0 = tree_cpu(), sampler.sample(), dict(adm)
            barrier.wait(timeout=300)
            t0 = time.perf_counter()
            res = coll.all_reduce({"x": x}, compressor=comp, timeout=120)
            dt = time.perf_counter() - t0
            cpu, parts = tree_cpu() - cpu0, CpuSampler.delta(parts0, sampler.sample())
            if not res.committed:  # counted and shown, never hidden; the next round re-forms
                st["failed"].append(res.reason[:120])
            if i == 0:
                if res.committed:
                    st["err"] = float((res.tensors["x"] - expected).abs().max())
                continue
            st["times"].append(dt if res.committed else None)
            st["cpu"].append(cpu)
            st["sent"].append(res.bytes_sent)
            st["group"].append(coll.last_timings.get("group", 0.0))
            timings = coll.last_timings
            flat = timings.flat() if hasattr(timings, "flat") else {"wall": dict(timings), "cpu": {}}
            admission = {k: adm[k] - adm0[k] for k in adm}
            st["phases"].append({**flat, "parts": parts, "admission": admission} if res.committed else None)
    return stats


def _report(q: Any, rank: int, numel: int, stats: dict[str, Any]) -> None:
    for key, st in stats.items():
        sent = [b for b in st["sent"] if b is not None]
        q.put(("result", rank, {
            "impl": "hivemind" if key == "hivemind" else "swarmtrain",
            "codec": "none" if key == "hivemind" else key,
            "numel": numel, "times": st["times"], "cpu": st["cpu"],
            "bytes_sent": statistics.median(sent) if sent else None,
            "max_abs_err": st["err"], "group_s": st["group"], "phases": st["phases"],
            "failed": st["failed"], "retries": st["retries"],
        }))  # fmt: skip


def _hivemind_peer(
    rank: int, initial: list[str], q: Any, barrier: Any, votes: Any, cfg: dict[str, Any]
) -> None:
    """A hivemind peer as hivemind's own examples run one: a plain ``hivemind.DHT`` (no record
    validators: the averager's group keys are hivemind's, which our signed-record DHT refuses) and a
    ``DecentralizedAverager`` per size."""
    import hivemind

    dht = hivemind.DHT(initial_peers=initial, host_maddrs=[LOOPBACK], start=True)
    try:
        q.put(("ready", rank, [str(m) for m in dht.get_visible_maddrs()]))
        barrier.wait(timeout=120)  # every peer's DHT is up
        for numel in cfg["sizes"]:
            x, expected = _vector(rank, numel), _expected_mean(cfg["n"], numel)
            _report(q, rank, numel, _hivemind_size(dht, rank, x, expected, (barrier, votes), cfg))
    finally:
        _quietly(dht.shutdown)


def _quietly(stop: Any) -> None:
    """Shut down a hivemind object; a failure while the other peers are leaving too is not a result."""
    try:
        stop()
    except Exception as e:
        print(f"shutdown: {type(e).__name__}: {e}", file=sys.stderr)


def _our_peer(rank: int, initial: list[str], q: Any, barrier: Any, cfg: dict[str, Any]) -> None:
    """Our peer: a ``PeerNode`` (signed records, admission) and a ``P2PCollective``."""
    from allreduce_phases import CpuSampler, time_admission

    from compression import build_compressor
    from peers import P2PCollective, PeerNode
    from swarmtrain.core.config import CompressionConfig, PeersConfig

    n = cfg["n"]
    with PeerNode(PeersConfig(run_id="bench-ar", initial_peers=initial, host_maddrs=[LOOPBACK])) as node:
        q.put(("ready", rank, node.visible_maddrs))
        node.wait_for_peers(n, timeout=120)
        comps = {c: build_compressor(CompressionConfig(codec=c)) for c in cfg["codecs"]}
        coll = P2PCollective(node, min_peers=n, expected_peers=n, chunk_elems=cfg["chunk_elems"])
        cfg = {**cfg, "sampler": CpuSampler(), "admission": time_admission(node)}
        for numel in cfg["sizes"]:
            x, expected = _vector(rank, numel), _expected_mean(n, numel)
            _report(q, rank, numel, _ours_size(coll, x, expected, barrier, comps, cfg))


def _worker(rank: int, initial: list[str], q: Any, barrier: Any, votes: Any, cfg: dict[str, Any]) -> None:
    """One peer: per size, ``rounds + 1`` rounds of hivemind's averager or of ours (every codec)."""
    import logging

    logging.basicConfig(
        level=os.environ.get("BENCH_LOG", "WARNING"), format="%(process)d %(name)s: %(message)s"
    )
    torch.set_num_threads(1)  # 4 peers on 2 shared cores: OpenMP spinning would dominate both sides
    mp.set_start_method("fork", force=True)  # hivemind's averager is a default-context mp.Process
    if cfg["impl"] == "hivemind":
        _hivemind_peer(rank, initial, q, barrier, votes, cfg)
    else:
        _our_peer(rank, initial, q, barrier, cfg)
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


def _row(rows: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """One (implementation, codec, size) over every peer: a round counts when every peer finished it;
    its time is the slowest peer's."""
    from allreduce_phases import phase_medians

    n_rounds = min(len(r["times"]) for r in rows)
    ok = [i for i in range(n_rounds) if all(r["times"][i] is not None for r in rows)]
    rounds_max = [max(r["times"][i] for r in rows) for i in ok] or [float("nan")]
    sent = [r["bytes_sent"] for r in rows if r["bytes_sent"] is not None]
    # the round minus this peer's group formation (comparable to hivemind's post-trigger time)
    data_only = [max(r["times"][i] - (r["group_s"][i] if r["group_s"] else 0.0) for r in rows) for i in ok]
    samples = [r["phases"][i] for r in rows for i in ok if r["phases"] and r["phases"][i]]
    return {
        "impl": rows[0]["impl"], "codec": rows[0]["codec"], "numel": rows[0]["numel"], "peers": n,
        "rounds_measured": len(ok),
        "round_s_median": statistics.median(rounds_max),
        "round_s_min": min(rounds_max), "round_s_max": max(rounds_max), "round_s_all": rounds_max,
        "data_phase_s_median": statistics.median(data_only or [float("nan")]),
        # CPU seconds of one round summed over every peer's process tree (peer, DHT process, p2pd,
        # hivemind's averager): what the round costs the machine
        "cpu_s_all_peers_median": statistics.median(
            [sum(r["cpu"][i] for r in rows) for i in ok] or [float("nan")]
        ),
        "bytes_sent_per_peer": statistics.mean(sent) if sent else None,
        "max_abs_err": max(r["max_abs_err"] for r in rows),
        "failed_rounds": max(len(r["failed"]) for r in rows),
        "failure_reasons": sorted({x for r in rows for x in r["failed"]})[:5],
        "matchmaking_retries": max(r.get("retries", 0) for r in rows),
        "phases": phase_medians(samples) if samples else None,
    }  # fmt: skip


def _run(n: int, cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """One side's peers; returns the rows every peer reported and, if the side broke off, why (one
    line): a side that fails keeps what it measured and never takes the run down."""
    ctx = process_context()
    q, barrier, votes = ctx.Queue(), ctx.Barrier(n), ctx.Array("i", n)
    procs: list[Any] = []
    per: dict[tuple[str, str, int], dict[int, dict[str, Any]]] = {}
    error = None
    try:
        procs.append(spawn_function(_guarded, (_worker, 0, [], q, barrier, votes, cfg)))
        _, _, boot = next_report(q, procs, 180)
        for r in range(1, n):
            procs.append(spawn_function(_guarded, (_worker, r, list(boot), q, barrier, votes, cfg)))
        done: set[int] = set()  # a peer that said done may exit: only the others must stay alive
        while len(done) < n:
            tag, rank, payload = next_report(q, [p for r, p in enumerate(procs) if r not in done], 900)
            if tag == "result":
                per.setdefault((payload["impl"], payload["codec"], payload["numel"]), {})[rank] = payload
            elif tag == "done":
                done.add(rank)
    except (RuntimeError, TimeoutError, OSError) as e:
        error = " ".join(str(e).split())[-300:]
        print(f"{cfg['impl']} side failed: {str(e)[-2000:]}", file=sys.stderr)
    finally:
        for p in procs:
            p.terminate(grace=5.0)
        left = [o.pid for p in procs for o in find_orphans(p.marker)]
        if left:
            print(f"warning: leftover processes {left}", file=sys.stderr)
    return [_row(list(by.values()), n) for by in per.values() if len(by) == n], error


def _parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "KM" else s) * mult)


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4M,16M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--peers", type=int, default=4)
    ap.add_argument("--codecs", default="none,int8")
    ap.add_argument("--chunk-elems", type=int, default=1 << 20, help="our elements per packet/frame")
    ap.add_argument("--only-ours", action="store_true", help="skip hivemind (quick experiments)")
    ap.add_argument(
        "--matchmaking-s", type=float, default=MATCHMAKING_S, help="hivemind's min_matchmaking_time"
    )
    ap.add_argument("--json", default=str(RESULTS / "allreduce.json"))
    ap.add_argument(
        "--append", action="store_true", help=f"also append this run to {RUNS.name} and update its summary"
    )
    ap.add_argument("--runs-json", default=str(RUNS), help="the run series --append extends")
    ap.add_argument("--summarize", action="store_true", help="only rewrite and print the series summary")
    return ap.parse_args(argv)


def _ratios(rows: list[dict[str, Any]]) -> None:
    base = {r["numel"]: r["round_s_median"] for r in rows if r["impl"] == "hivemind"}
    for r in rows:
        hm = base.get(r["numel"])
        ok = hm is not None and hm == hm  # a hivemind row whose every round failed has a NaN median
        r["ratio_vs_hivemind_fp32"] = r["round_s_median"] / hm if ok else None
        r["data_ratio_vs_hivemind_fp32"] = r["data_phase_s_median"] / hm if ok else None
    rows.sort(key=lambda r: (r["numel"], r["impl"] != "hivemind", r["codec"]))


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.summarize:
        summary = write_summary(Path(args.runs_json))
        print(format_summary(summary))
        return 0
    cfg = {
        "n": args.peers, "sizes": [_parse_size(s) for s in args.sizes.split(",")],
        "codecs": args.codecs.split(","), "rounds": args.rounds, "chunk_elems": args.chunk_elems,
        "matchmaking_s": args.matchmaking_s,
    }  # fmt: skip
    t0, record = time.time(), recorded(argv)
    rows: list[dict[str, Any]] = []
    sides: dict[str, dict[str, Any]] = {}
    for impl in ["swarmtrain"] if args.only_ours else ["hivemind", "swarmtrain"]:
        side_rows, error = _run(args.peers, {**cfg, "impl": impl})
        first_error, want = None, len(cfg["sizes"]) * (1 if impl == "hivemind" else len(cfg["codecs"]))
        if error and len(side_rows) < want:  # one more try of the whole side, recorded in sides
            print(f"{impl} side: one more try after: {error}", file=sys.stderr)
            first_error = error
            side_rows, error = _run(args.peers, {**cfg, "impl": impl})
        rows += side_rows
        sides[impl] = {"rows": len(side_rows), "error": error, "retried_after": first_error}
    if not rows:
        why = "; ".join(f"{k}: {v['error']}" for k, v in sides.items())
        print(f"allreduce: nothing measured ({why})", file=sys.stderr)
        return 1
    _ratios(rows)
    out = {
        "benchmark": "allreduce", "peers": args.peers, "rounds": args.rounds, "chunk_elems": args.chunk_elems,
        "hivemind": {"min_matchmaking_time": args.matchmaking_s},
        "wall_s": time.time() - t0, "recorded": record,
        "loadavg_before": record["loadavg"], "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "sides": sides, "rows": rows,
    }  # fmt: skip
    table = [
        *_table(rows),
        *phase_lines(rows),
        *[f"{impl} side broke off: {s['error']}" for impl, s in sides.items() if s["error"]],
        f"load average (1/5/15 min) before {out['loadavg_before']}, after {out['loadavg_after']}",
    ]
    write_report(Path(args.json), out, table, plot=plot_phases)
    if args.append:
        entry = append_run(Path(args.runs_json), "allreduce", out, note=RUNS_NOTE, record=record)
        summary = write_summary(Path(args.runs_json))
        print(f"appended run {entry['run']} to {args.runs_json}")
        print(format_summary(summary))
    return 0


def _table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per implementation, codec and size."""
    lines = [
        f"{'impl':<11} {'codec':<6} {'elements':>9} {'median s':>9} {'min s':>7} {'max s':>7} "
        f"{'data s':>7} {'cpu s':>6} {'MiB sent/peer':>13} {'x hivemind':>10} {'data x hm':>9} "
        f"{'max|err|':>9} {'failed':>6} {'retries':>7}"
    ]
    for r in rows:
        mib = f"{r['bytes_sent_per_peer'] / 2**20:.1f}" if r["bytes_sent_per_peer"] else "-"
        lines.append(
            f"{r['impl']:<11} {r['codec']:<6} {r['numel'] / 2**20:>8.2f}M {r['round_s_median']:>9.3f} "
            f"{r['round_s_min']:>7.3f} {r['round_s_max']:>7.3f} {r['data_phase_s_median']:>7.3f} "
            f"{r['cpu_s_all_peers_median']:>6.2f} {mib:>13} "
            f"{r['ratio_vs_hivemind_fp32'] or float('nan'):>10.2f} "
            f"{r['data_ratio_vs_hivemind_fp32'] or float('nan'):>9.2f} "
            f"{r['max_abs_err']:>9.2e} {r['failed_rounds']:>6} {r['matchmaking_retries']:>7}"
        )
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
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints where a long run waits
    sys.exit(main())
