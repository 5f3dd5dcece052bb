"""How long ``swarmtrain status`` takes against a live local run, and what the in-process reader saves.

Starts a bootstrap (``swarmtrain dht``) and ``--volunteers`` real ``swarmtrain join`` processes on
127.0.0.1 (tiny model, DiLoCo), waits until all of them have committed a round, then alternates, for
``--calls`` rounds, two ways of reading the run's peers, each a fresh process as a user would start:

* ``status``: the CLI, ``swarmtrain status --initial-peers ADDR --run-id RUN`` (its in-process
  ``peers.dht.monitor.RunReader``: one p2p daemon and a client DHT node in the command's own process);
* ``child DHT``: the way status read before, a read-only ``PeerNode`` (hivemind's DHT in a child
  process whose p2p daemon is replicated into the caller), the same records read.

Both run while the volunteers train on the same cores, so the figures include that load. Prints a
table of wall seconds per call (median, max), the ratio of medians, and writes
``benchmarks/results/status_latency.json``.

    python benchmarks/status_latency.py --volunteers 3 --calls 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import RESULTS, recorded, write_report  # noqa: E402

from peers import find_orphans, spawn_command  # noqa: E402

SW = [sys.executable, "-m", "swarmtrain"]
LOOP = ["--host-maddrs", "/ip4/127.0.0.1/tcp/0"]

CHILD_DHT_READ = """
import sys
from peers.rounds.guard import read_tables
from peers.dht.node import PeerNode
from swarmtrain.core.config import load_config
cfg = load_config(None, {"peers.run_id": sys.argv[2], "peers.initial_peers": [sys.argv[1]],
                         "peers.host_maddrs": ["/ip4/127.0.0.1/tcp/0"]}).peers
with PeerNode(cfg, role="monitor", client_mode=True, publish_record=False, startup_timeout=60) as node:
    records = node.live_peers(timeout=60)
    read_tables(node.dht, cfg.run_id, 60)
print(len([r for r in records if r.role == "trainer"]))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SWARMTRAIN_TRAIN__THREADS": "1",
            "SWARMTRAIN_TRAIN__EVAL_INTERVAL": "100000",
            "SWARMTRAIN_TRAIN__BATCH_SIZE": "8",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _timed(argv: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_env())
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{argv[3:5]} failed: {out.stderr[-1000:]}")
    return wall, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--volunteers", type=int, default=3)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS / "status_latency.json")
    args = ap.parse_args()
    run = "status-bench"
    procs = []
    with tempfile.TemporaryDirectory(prefix="status-bench-") as tmp_s:
        tmp = Path(tmp_s)
        try:
            dht_out = tmp / "dht.out"
            procs.append(
                spawn_command([*SW, "dht", *LOOP, "--run-id", run], env=_env(), stdout=dht_out.open("w"))
            )
            maddr = ""
            for _ in range(600):
                m = re.search(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)", dht_out.read_text())
                if m:
                    maddr = m.group(1)
                    break
                time.sleep(0.2)
            if not maddr:
                raise SystemExit("the bootstrap printed no address")
            for i in range(args.volunteers):
                argv = [*SW, "join", "--initial-peers", maddr, "--run-id", run, *LOOP]
                argv += ["-s", "diloco", "-H", "10", "--steps", "100000", "--json", str(tmp / f"v{i}.json")]
                procs.append(spawn_command(argv, env=_env(), stderr=(tmp / f"v{i}.err").open("w")))
            status = [*SW, "status", "--initial-peers", maddr, "--run-id", run, "--json"]
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:  # every volunteer has committed a round
                rows = json.loads(_timed(status)[1])
                if sum(1 for r in rows if r.get("extra", {}).get("committed", 0) > 0) >= args.volunteers:
                    break
                time.sleep(2)
            else:
                raise SystemExit("the volunteers committed no round in 10 minutes")
            times: dict[str, list[float]] = {"status": [], "child DHT": []}
            child = [sys.executable, "-c", CHILD_DHT_READ, maddr, run]
            for _ in range(args.calls):
                wall, out = _timed(status)
                assert sum(1 for r in json.loads(out) if r["role"] == "trainer") == args.volunteers
                times["status"].append(wall)
                wall, out = _timed(child)
                assert int(out.strip()) == args.volunteers, out
                times["child DHT"].append(wall)
        finally:
            for p in procs:
                p.terminate(grace=5.0)
            left = [o for p in procs for o in find_orphans(p.marker)]
    rows: list[dict[str, Any]] = [
        {"reader": k, "median_s": statistics.median(v), "max_s": max(v), "calls": v} for k, v in times.items()
    ]
    ratio = rows[1]["median_s"] / rows[0]["median_s"]
    print(f"{'reader':<12}{'median s':>10}{'max s':>8}")
    for r in rows:
        print(f"{r['reader']:<12}{r['median_s']:>10.2f}{r['max_s']:>8.2f}")
    print(f"child DHT / status (medians): {ratio:.2f}x; {args.volunteers} volunteers training meanwhile")
    result = {
        "benchmark": "status_latency",
        "recorded": recorded(),
        "volunteers": args.volunteers,
        "calls": args.calls,
        "readers": rows,
        "ratio_child_dht_over_status": ratio,
        "orphans": len(left),
    }
    write_report(args.out, result)


if __name__ == "__main__":
    main()
