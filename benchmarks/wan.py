"""All-reduce round time across emulated regions vs the bandwidth bound ``2(n-1)/n * S/B + 2 RTT``.

Three peers, one per region of ``examples/topologies/three_regions.toml`` (10 ms RTT inside a region,
80 / 120 / 150 ms between), each in its own network namespace with its link capped at ``B`` (20 and
100 Mbit/s, both directions, ``tc tbf``) and every byte between two peers delayed by the userspace
proxy (``swarmtrain.simulation.regions``: the same network ``swarmtrain simulate --topology``
builds). The peers average an fp32 vector the size of the tiny preset's parameters with swarmtrain's
butterfly all-reduce (``peers.P2PCollective``), sent with each codec of ``--codecs`` (``none``: fp32,
and ``int8``), after a barrier, for a few timed rounds after one warm-up round. ``S`` is what a
peer's codec sends (the byte ledger's count over ``2(n-1)/n``; fp32: the payload).

Per run, rate and codec: the round time (the slowest peer's ``all_reduce`` call, group formation
over the DHT included: median, min, max), its data phase (the round minus that peer's group
formation), the bytes each peer sent, the RTTs measured through the proxy, the bound (each peer
must send and receive ``2(n-1)/n * S`` through its own link, and a reduce-scatter then an
all-gather each wait at least one round trip on the slowest pair), the phases of the slowest peer,
and the network's own floor: the same bytes sent by plain TCP through the same proxy, every pair at
once (``tcp_all_to_all_s``, ``swarmtrain.simulation.link_check``). Each setting also runs as a
control with the same caps and every RTT 0 (``--no-control`` skips it). ``summary`` holds, per rate,
codec and delay, the medians over ``--runs`` runs with their ranges, and per phase of a delayed
entry the round trips it spends beyond its control (``extra_rtts``). Root only; the namespaces are
removed on every exit (``docs/decisions.md``, eleventh session).

Usage::

    sudo python benchmarks/wan.py                 # -> benchmarks/results/wan.json + wan.png
    sudo python benchmarks/wan.py --rates 20 --codecs none --runs 1 --rounds 2 --out /tmp/wan_quick.json
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from allreduce import next_report  # noqa: E402
from runlog import loadavg, median_range, pyplot, recorded, save_figure, write_report  # noqa: E402

from peers.dht.process import find_orphans, process_context, spawn_function  # noqa: E402
from swarmtrain.simulation.netns import in_namespace  # noqa: E402
from swarmtrain.simulation.regions import EmulatedRegions  # noqa: E402
from swarmtrain.simulation.runner import quiet_resource_tracker  # noqa: E402
from swarmtrain.simulation.topology import load_topology  # noqa: E402

__all__ = ["bound_s", "run_rate", "shown_path", "main"]

RESULTS = HERE / "results"
TOPOLOGY = ROOT / "examples" / "topologies" / "three_regions.toml"


def shown_path(path: Path) -> str:
    """``path`` as the JSON records it: relative to the repository root when it lies inside it (so a
    result names no directory of the machine that ran it), else as given."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def bound_s(n: int, nbytes: float, rate_mbit: float, rtt_s: float) -> float:
    """``2(n-1)/n * S/B + 2 RTT``: the least a butterfly all-reduce of ``nbytes`` can take."""
    return 2 * (n - 1) / n * nbytes * 8 / (rate_mbit * 1e6) + 2 * rtt_s


def _worker(
    rank: int,
    host: str,
    announce: str,
    initial: list[str],
    q: Any,
    barrier: Any,
    n: int,
    numel: int,
    rounds: int,
    codec: str,
) -> None:
    """One peer in its region: ``rounds + 1`` all-reduces of ``numel`` fp32 elements sent with
    ``codec`` (the first untimed)."""
    import traceback

    try:
        import torch

        from compression import build_compressor
        from peers import P2PCollective, PeerNode
        from swarmtrain.core.config import CompressionConfig, PeersConfig

        torch.set_num_threads(1)
        cfg = PeersConfig(
            run_id="bench-wan", initial_peers=initial, host_maddrs=[host], announce_maddrs=[announce]
        )
        with PeerNode(cfg) as node:
            q.put(("ready", rank, node.visible_maddrs))
            node.wait_for_peers(n, timeout=180)
            comp = build_compressor(CompressionConfig(codec=codec))
            coll = P2PCollective(node, min_peers=n, expected_peers=n)
            x = torch.full((numel,), float(rank + 1))
            times, sent, failed = [], [], []
            phases: list[dict[str, float]] = []  # the round's phase timings (peers.rounds.round_io)
            for i in range(rounds + 1):
                barrier.wait(timeout=600)
                t0 = time.perf_counter()
                res = coll.all_reduce({"x": x}, compressor=comp, timeout=300)
                dt = time.perf_counter() - t0
                if not res.committed:
                    failed.append(str(res.reason)[:120])
                    continue
                mean = (n + 1) / 2
                if float((res.tensors["x"] - mean).abs().max()) > 1e-4 * mean:  # constants: exact in int8
                    failed.append("wrong mean")
                if i > 0:
                    times.append(dt)
                    sent.append(int(res.bytes_sent))
                    phases.append({k: float(v) for k, v in coll.last_timings.items()})
            result = {"times": times, "sent": sent, "failed": failed, "phases": phases}
            q.put(("result", rank, result))
            barrier.wait(timeout=600)  # nobody leaves while another still needs it
    except BaseException:
        q.put(("error", rank, traceback.format_exc()[-3000:]))
        raise


def run_rate(
    rate_mbit: float,
    n: int,
    numel: int,
    rounds: int,
    topology: Path = TOPOLOGY,
    no_delay: bool = False,
    codec: str = "none",
) -> dict[str, Any]:
    """Build the regions of ``topology`` at ``rate_mbit`` per peer (``no_delay``: every RTT 0, the
    control), run the all-reduces with ``codec``, then the network's own floor for the same bytes
    (``EmulatedRegions.all_to_all_s``: plain TCP through the proxy); return the row."""
    topo = load_topology(topology)
    update: dict[str, Any] = {"rate_mbit": rate_mbit}
    if no_delay:
        update["regions"] = [r.model_copy(update={"rtt_ms": 0.0}) for r in topo.regions]
        update["links"] = [x.model_copy(update={"rtt_ms": 0.0}) for x in topo.links]
    topo = topo.model_copy(update=update)
    quiet_resource_tracker()  # hivemind's semaphores in peers terminated at the end: not leaks
    ctx = process_context()
    q, barrier = ctx.Queue(), ctx.Barrier(n)
    procs: list[Any] = []
    with EmulatedRegions(topo, n) as net:
        rtts = net.measure()
        try:
            initial: list[str] = []
            per: dict[int, dict[str, Any]] = {}
            for r in range(n):
                node = net.plan.node_of_rank(r)
                target = functools.partial(in_namespace, node.ns, _worker)
                args = (
                    r,
                    node.host_maddr,
                    node.announce_maddr,
                    list(initial),
                    q,
                    barrier,
                    n,
                    numel,
                    rounds,
                    codec,
                )
                procs.append(spawn_function(target, args, name=f"wan{r}"))
                if r == 0:
                    tag, _, initial = next_report(q, procs, 180)
            while len(per) < n:
                tag, rank, payload = next_report(q, procs, 1800)
                if tag == "result":
                    per[rank] = payload
            proxy_bytes = sum(net.proxy.bytes.values()) if net.proxy else 0
        finally:
            for p in procs:
                p.terminate(grace=5.0)
            left = [o.pid for p in procs for o in find_orphans(p.marker)]
            if left:
                print(f"warning: leftover processes {left}", file=sys.stderr)
        rows = [per[r] for r in range(n)]
        k = min(len(r["times"]) for r in rows)
        sent = statistics.mean(s for r in rows for s in r["sent"]) if k else 0.0
        # the round's S: what a peer sent, as the bound counts it (fp32: 4 * numel, 0.03 % headers)
        nbytes = sent * n / (2 * (n - 1)) if sent else numel * 4.0
        nodes = [net.plan.node_of_rank(r).index for r in range(n)]
        tcp_s = [net.all_to_all_s(nodes, int(2 * nbytes / n)) for _ in range(3)]
    round_s = [max(r["times"][i] for r in rows) for i in range(k)]
    data_s = [max(r["times"][i] - r["phases"][i].get("group", 0.0) for r in rows) for i in range(k)]
    phases = _slowest_phases(rows, k)
    rtt_max_s = (
        max(topo.rtt_ms(a.region, b.region) for a in net.nodes[1:] for b in net.nodes[1:] if a != b) / 1e3
    )
    bound = bound_s(n, nbytes, rate_mbit, rtt_max_s)
    med = statistics.median(round_s) if round_s else float("nan")
    dmed = statistics.median(data_s) if data_s else float("nan")
    return {
        "rate_mbit": rate_mbit,
        "codec": codec,
        "delay": not no_delay,
        "peers": n,
        "regions": [net.nodes[r + 1].region for r in range(n)],
        "payload_bytes": nbytes,
        "rtt_ms_measured": rtts,
        "rtt_max_ms_configured": rtt_max_s * 1e3,
        "bound_s": bound,
        "bound_transfer_s": bound - 2 * rtt_max_s,
        "tcp_all_to_all_s": statistics.median(tcp_s),
        "round_s_median": med,
        "round_s_min": min(round_s, default=float("nan")),
        "round_s_max": max(round_s, default=float("nan")),
        "round_s_all": round_s,
        "data_phase_s_median": dmed,
        "round_over_bound": med / bound,
        "data_phase_over_bound": dmed / bound,
        "phases_s_median": phases,
        "bytes_sent_per_peer_per_round": sent or None,
        "bound_bytes_per_peer": 2 * (n - 1) / n * nbytes,
        "proxy_bytes": proxy_bytes,
        "failed_rounds": sum(len(r["failed"]) for r in rows),
        "failures": sorted({f for r in rows for f in r["failed"]})[:5],
        "loadavg": loadavg(),
    }


def _slowest_phases(rows: list[dict[str, Any]], k: int) -> dict[str, float]:
    """Per phase of a round (``P2PCollective.last_timings``: group formation, encoding, the exchange,
    waiting for the sends, the commit agreement...), the median over rounds of the seconds the
    slowest peer of each round spent in it: where a round's time above the bound goes."""
    per: dict[str, list[float]] = {}
    for i in range(k):
        slowest = max(rows, key=lambda r: r["times"][i])
        for name, s in slowest["phases"][i].items():
            per.setdefault(name, []).append(s)
    return {name: statistics.median(v) for name, v in per.items()}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rate, codec and delay, over the runs: the median of the runs' median rounds with their
    range, the same for round / bound and data phase / bound, the network's own floor (plain TCP
    through the proxy, ``tcp_all_to_all_s``) and the slowest peer's phases. For a delayed entry,
    ``extra_rtts``: per phase, the seconds above the control's (same caps, RTT 0) in units of the
    largest RTT: how many round trips each phase waits."""
    groups: dict[tuple[float, str, bool], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["rate_mbit"], r["codec"], r["delay"]), []).append(r)

    def med_range(key: str, rs: list[dict[str, Any]]) -> tuple[Any, Any]:
        return median_range([float(r[key]) for r in rs])

    out = []
    for key, rs in groups.items():
        rate, codec, delay = key
        names = dict.fromkeys(p for r in rs for p in r["phases_s_median"])  # in round order
        phases = {p: statistics.median(r["phases_s_median"].get(p, 0.0) for r in rs) for p in names}
        round_s, round_range = med_range("round_s_median", rs)
        over, over_range = med_range("round_over_bound", rs)
        data_over, _ = med_range("data_phase_over_bound", rs)
        tcp, _ = med_range("tcp_all_to_all_s", rs)
        out.append(
            {
                "rate_mbit": rate,
                "codec": codec,
                "delay": delay,
                "runs": len(rs),
                "payload_bytes": statistics.median(r["payload_bytes"] for r in rs),
                "rtt_max_ms_configured": rs[0]["rtt_max_ms_configured"],
                "bound_s": statistics.median(r["bound_s"] for r in rs),
                "tcp_all_to_all_s": tcp,
                "round_s": round_s,
                "round_s_range": round_range,
                "round_over_bound": over,
                "round_over_bound_range": over_range,
                "data_phase_over_bound": data_over,
                "phases_s": phases,
                "failed_rounds": sum(r["failed_rounds"] for r in rs),
            }
        )
    control = {(e["rate_mbit"], e["codec"]): e for e in out if not e["delay"]}
    for e in out:
        c = control.get((e["rate_mbit"], e["codec"]))
        rtt = e["rtt_max_ms_configured"] / 1e3
        if e["delay"] and c is not None and rtt > 0:
            e["extra_rtts"] = {
                p: (v - c["phases_s"].get(p, 0.0)) / rtt for p, v in e["phases_s"].items() if v >= 0.01
            }
    return out


def _phase_lines(doc: dict[str, Any]) -> str:
    """Per delayed entry, the slowest peer's median seconds per phase (those of 10 ms or more) and
    the round trips each adds over the control, 80 columns."""
    import textwrap

    out = ["phases of the slowest peer, median s (extra RTTs over the control):"]
    for e in doc["summary"]:
        if not e["delay"]:
            continue
        head = f"{e['rate_mbit']:g} Mbit/s {e['codec']}: "
        extra = e.get("extra_rtts", {})
        ph = ", ".join(
            f"{k} {v:.2f}" + (f" ({extra[k]:+.1f})" if k in extra else "")
            for k, v in e["phases_s"].items()
            if v >= 0.01
        )
        out += textwrap.wrap(head + ph, 80, subsequent_indent="    ")
    return "\n".join(out)


def _table(doc: dict[str, Any]) -> str:
    lines = [
        f"{'Mbit/s':>6}{'codec':>6}{'delay':>6}{'S MB':>6}{'bound s':>8}{'tcp s':>7}{'round s':>8}"
        f"{'range':>12}{'rnd/bnd':>8}{'data/bnd':>9}{'failed':>7}"
    ]
    for e in doc["summary"]:
        lo, hi = e["round_s_range"]
        lines.append(
            f"{e['rate_mbit']:>6g}{e['codec']:>6}{'yes' if e['delay'] else 'no':>6}"
            f"{e['payload_bytes'] / 1e6:>6.2f}{e['bound_s']:>8.2f}{e['tcp_all_to_all_s']:>7.2f}"
            f"{e['round_s']:>8.2f}{f'{lo:.2f}-{hi:.2f}':>12}{e['round_over_bound']:>8.2f}"
            f"{e['data_phase_over_bound']:>9.2f}{e['failed_rounds']:>7}"
        )
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    entries = [e for e in doc["summary"] if e["delay"]]
    labels = [f"{e['rate_mbit']:g} Mbit/s\n{e['codec']}" for e in entries]
    xs = list(range(len(entries)))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    w = 0.26
    ax.bar([x - w for x in xs], [e["bound_s"] for e in entries], w, label="bound 2(n-1)/n S/B + 2 RTT")
    ax.bar(xs, [e["tcp_all_to_all_s"] for e in entries], w, label="plain TCP, same bytes (network floor)")
    lo = [e["round_s"] - e["round_s_range"][0] for e in entries]
    hi = [e["round_s_range"][1] - e["round_s"] for e in entries]
    ax.bar(
        [x + w for x in xs], [e["round_s"] for e in entries], w, yerr=[lo, hi], capsize=3,
        label="round (median of runs, range)",
    )  # fmt: skip
    for x, e in zip(xs, entries, strict=True):
        ax.text(
            x + w,
            e["round_s_range"][1],
            f"{e['round_over_bound']:.2f}x",
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xticks(xs, labels)
    ax.set_ylabel("seconds")
    n = doc["peers"]
    ax.set_title(f"all-reduce, {n} peers in 3 regions (RTT 80-150 ms), {doc['runs']} runs", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run each rate and codec ``--runs`` times, print the table, write the JSON and PNG."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="20,100", help="per-peer Mbit/s, comma-separated")
    ap.add_argument("--codecs", default="none,int8", help="codecs, comma-separated (none: fp32)")
    ap.add_argument("--runs", type=int, default=3, help="runs of every rate and codec (fresh network each)")
    ap.add_argument("--peers", type=int, default=3, help="peers (round-robin over the three regions)")
    ap.add_argument("--numel", type=int, default=0, help="fp32 elements (default: the tiny preset's params)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per run (after one warm-up)")
    ap.add_argument("--out", type=Path, default=RESULTS / "wan.json")
    ap.add_argument("--no-control", action="store_true", help="skip the same caps without delay")
    ap.add_argument("--topology", type=Path, default=TOPOLOGY, help="regions and RTTs (its rate is replaced)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("benchmarks/wan.py: network namespaces and tc need root", file=sys.stderr)
        return 2
    if args.runs < 1 or args.rounds < 1:
        print("benchmarks/wan.py: --runs and --rounds must be >= 1", file=sys.stderr)
        return 2
    numel = args.numel
    if numel <= 0:
        from swarmtrain.app.models import build_model
        from swarmtrain.core.config import ModelConfig

        numel = sum(p.numel() for p in build_model(ModelConfig(preset="tiny")).parameters())
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    codecs = [x.strip() for x in args.codecs.split(",") if x.strip()]
    rows = []
    for run in range(args.runs):
        for rate in rates:
            for codec in codecs:
                for no_delay in (False, True)[: 1 if args.no_control else 2]:
                    what = "no delay (control)" if no_delay else "delay"
                    print(f"run {run + 1}/{args.runs}: {rate:g} Mbit/s, {codec}, {what} ...", flush=True)
                    row = run_rate(rate, args.peers, numel, args.rounds, args.topology, no_delay, codec)
                    rows.append({"run": run, **row})
    doc = {
        "benchmark": "wan",
        "topology": shown_path(args.topology),
        "numel": numel,
        "peers": args.peers,
        "rounds": args.rounds,
        "runs": args.runs,
        "recorded": recorded(),
        "note": (
            "round: the slowest peer's all_reduce call after a barrier (group formation over the DHT "
            "included); data phase: the round minus that peer's group formation; bound: "
            "2(n-1)/n * S/B + 2 * the largest RTT between two peers' regions, S the bytes a peer's "
            "codec sends (fp32: the payload); tcp_all_to_all_s: the same bytes by plain TCP through "
            "the proxy, every pair at once (the network's own floor); delay false: the control, "
            "the same caps with every RTT 0 (so the bound is the transfer alone); summary: medians "
            "over the runs with their ranges, extra_rtts: per phase, seconds above the control's in "
            "units of the largest RTT"
        ),
        "summary": summarize(rows),
        "rows": rows,
    }
    write_report(args.out, doc, [_table(doc), _phase_lines(doc)], plot=_plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
