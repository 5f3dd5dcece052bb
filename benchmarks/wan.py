"""All-reduce round time across emulated regions vs the bandwidth bound ``2(n-1)/n * S/B + 2 RTT``.

Three peers, one per region of ``examples/topologies/three_regions.toml`` (10 ms RTT inside a region,
80 / 120 / 150 ms between), each in its own network namespace with its link capped at ``B`` (20 and
100 Mbit/s, both directions, ``tc tbf``) and every byte between two peers delayed by the userspace
proxy (``swarmtrain.simulation.regions``: the same network ``swarmtrain simulate --topology``
builds). The peers average an fp32 vector the size of the tiny preset's parameters (``S`` bytes) with
swarmtrain's butterfly all-reduce (``peers.P2PCollective``, codec ``none``), after a barrier, for a
few timed rounds after one warm-up round.

Per rate: the round time (the slowest peer's ``all_reduce`` call, group formation over the DHT
included: median, min, max), its data phase (the round minus that peer's group formation), the
bytes each peer sent (byte ledger), the RTTs measured through the proxy, and the bound
``2(n-1)/n * S/B + 2 * RTT_max`` (each peer must send and receive ``2(n-1)/n * S`` through its own
link, and a reduce-scatter then an all-gather each wait at least one round trip on the slowest pair)
with the ratios round / bound and data phase / bound. Per rate a control run follows with the same
caps and every RTT 0 (``--no-control`` skips it): the data phase's excess over the transfer there is
the protocol's cost at that rate, and what the delayed run adds beyond it is the latency's (more
than the bound's 2 RTT: a round makes several sequential round trips). Root only; the namespaces
are removed on every exit (``docs/decisions.md``, eleventh session).

Usage::

    sudo python benchmarks/wan.py                 # 20 and 100 Mbit/s -> benchmarks/results/wan.json + wan.png
    sudo python benchmarks/wan.py --rates 20 --rounds 2 --out /tmp/wan_quick.json
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
from runlog import loadavg, pyplot, recorded, save_figure, write_report  # noqa: E402

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
) -> None:
    """One peer in its region: ``rounds + 1`` fp32 all-reduces of ``numel`` elements (the first untimed)."""
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
            comp = build_compressor(CompressionConfig(codec="none"))
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
                if float((res.tensors["x"] - mean).abs().max()) > 1e-4:
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
    rate_mbit: float, n: int, numel: int, rounds: int, topology: Path = TOPOLOGY, no_delay: bool = False
) -> dict[str, Any]:
    """Build the regions of ``topology`` at ``rate_mbit`` per peer (``no_delay``: every RTT 0, the
    control), run the all-reduces, return the row."""
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
                args = (r, node.host_maddr, node.announce_maddr, list(initial), q, barrier, n, numel, rounds)
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
    round_s = [max(r["times"][i] for r in rows) for i in range(k)]
    data_s = [max(r["times"][i] - r["phases"][i].get("group", 0.0) for r in rows) for i in range(k)]
    phases = _slowest_phases(rows, k)
    nbytes = numel * 4
    rtt_max_s = (
        max(topo.rtt_ms(a.region, b.region) for a in net.nodes[1:] for b in net.nodes[1:] if a != b) / 1e3
    )
    bound = bound_s(n, nbytes, rate_mbit, rtt_max_s)
    med = statistics.median(round_s) if round_s else float("nan")
    dmed = statistics.median(data_s) if data_s else float("nan")
    return {
        "rate_mbit": rate_mbit,
        "delay": not no_delay,
        "peers": n,
        "regions": [net.nodes[r + 1].region for r in range(n)],
        "payload_bytes": nbytes,
        "rtt_ms_measured": rtts,
        "rtt_max_ms_configured": rtt_max_s * 1e3,
        "bound_s": bound,
        "bound_transfer_s": bound - 2 * rtt_max_s,
        "round_s_median": med,
        "round_s_min": min(round_s, default=float("nan")),
        "round_s_max": max(round_s, default=float("nan")),
        "round_s_all": round_s,
        "data_phase_s_median": dmed,
        "round_over_bound": med / bound,
        "data_phase_over_bound": dmed / bound,
        "phases_s_median": phases,
        "bytes_sent_per_peer_per_round": statistics.mean(s for r in rows for s in r["sent"]) if k else None,
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


def _phase_lines(doc: dict[str, Any]) -> str:
    """Per row, the slowest peer's median seconds per phase (those of 10 ms or more), 80 columns."""
    import textwrap

    out = ["phases of the slowest peer, median s:"]
    for r in doc["rows"]:
        head = f"{r['rate_mbit']:g} Mbit/s {'delay' if r['delay'] else 'no delay'}: "
        ph = ", ".join(f"{k} {v:.2f}" for k, v in (r.get("phases_s_median") or {}).items() if v >= 0.01)
        out += textwrap.wrap(head + ph, 80, subsequent_indent="    ")
    return "\n".join(out)


def _table(doc: dict[str, Any]) -> str:
    lines = [
        f"{'Mbit/s':>7}{'delay':>6}{'S MB':>7}{'RTTmax ms':>10}{'bound s':>9}{'round s':>9}{'data s':>8}"
        f"{'round/bnd':>10}{'data/bnd':>9}{'sent MB':>9}{'failed':>7}"
    ]
    for r in doc["rows"]:
        sent = r["bytes_sent_per_peer_per_round"] or 0
        lines.append(
            f"{r['rate_mbit']:>7g}{'yes' if r['delay'] else 'no':>6}{r['payload_bytes'] / 1e6:>7.2f}"
            f"{r['rtt_max_ms_configured']:>10.0f}"
            f"{r['bound_s']:>9.2f}{r['round_s_median']:>9.2f}{r['data_phase_s_median']:>8.2f}"
            f"{r['round_over_bound']:>10.2f}{r['data_phase_over_bound']:>9.2f}{sent / 1e6:>9.2f}"
            f"{r['failed_rounds']:>7}"
        )
    return "\n".join(lines)


def _plot(doc: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    control = {r["rate_mbit"]: r for r in doc["rows"] if not r["delay"]}
    rows = [r for r in doc["rows"] if r["delay"]]
    labels = [f"{r['rate_mbit']:g} Mbit/s" for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    w = 0.26
    ax.bar([x - w for x in xs], [r["bound_s"] for r in rows], w, label="bound 2(n-1)/n S/B + 2 RTT")
    ax.bar(list(xs), [r["data_phase_s_median"] for r in rows], w, label="data phase (median)")
    ax.bar([x + w for x in xs], [r["round_s_median"] for r in rows], w, label="round incl. group (median)")
    for x, r in zip(xs, rows, strict=True):
        ax.text(
            x + w, r["round_s_median"], f"{r['round_over_bound']:.2f}x", ha="center", va="bottom", fontsize=8
        )
    ctl = [
        control[r["rate_mbit"]]["data_phase_s_median"] if r["rate_mbit"] in control else None for r in rows
    ]
    if any(c is not None for c in ctl):
        ys = [c if c is not None else float("nan") for c in ctl]
        ax.scatter(
            list(xs), ys, color="k", marker="_", s=900, zorder=3, label="data phase, same caps, no delay"
        )
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("seconds")
    n = rows[0]["peers"] if rows else 0
    ax.set_title(f"fp32 all-reduce, {n} peers in 3 regions (RTT 80-150 ms)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run each rate, print the table, write the JSON and PNG."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="20,100", help="per-peer Mbit/s, comma-separated")
    ap.add_argument("--peers", type=int, default=3, help="peers (round-robin over the three regions)")
    ap.add_argument("--numel", type=int, default=0, help="fp32 elements (default: the tiny preset's params)")
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per rate (after one warm-up)")
    ap.add_argument("--out", type=Path, default=RESULTS / "wan.json")
    ap.add_argument("--no-control", action="store_true", help="skip the same caps without delay")
    ap.add_argument("--topology", type=Path, default=TOPOLOGY, help="regions and RTTs (its rate is replaced)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("benchmarks/wan.py: network namespaces and tc need root", file=sys.stderr)
        return 2
    numel = args.numel
    if numel <= 0:
        from swarmtrain.app.models import build_model
        from swarmtrain.core.config import ModelConfig

        numel = sum(p.numel() for p in build_model(ModelConfig(preset="tiny")).parameters())
    rows = []
    for rate in [float(x) for x in args.rates.split(",") if x.strip()]:
        print(f"{rate:g} Mbit/s ...", flush=True)
        rows.append(run_rate(rate, args.peers, numel, args.rounds, args.topology))
        if not args.no_control:
            print(f"{rate:g} Mbit/s, no delay (control) ...", flush=True)
            rows.append(run_rate(rate, args.peers, numel, args.rounds, args.topology, no_delay=True))
    doc = {
        "benchmark": "wan",
        "topology": shown_path(args.topology),
        "numel": numel,
        "rounds": args.rounds,
        "recorded": recorded(),
        "note": (
            "round: the slowest peer's all_reduce call after a barrier (group formation over the DHT "
            "included); data phase: the round minus that peer's group formation; bound: "
            "2(n-1)/n * S/B + 2 * the largest RTT between two peers' regions; delay false: the control, "
            "the same caps with every RTT 0 (so the bound is the transfer alone)"
        ),
        "rows": rows,
    }
    write_report(args.out, doc, [_table(doc), _phase_lines(doc)], plot=_plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
