"""Time from launch to the first committed round, and state bytes downloaded, for a fresh and for a
restarted volunteer of a live local run.

Starts a bootstrap (``swarmtrain dht``) and two ``swarmtrain join`` volunteers on 127.0.0.1 (tiny
preset, DiLoCo, int8, open admission with the mean on loopback), waits until they have committed
``--warmup`` rounds, then measures:

* ``fresh``: a third volunteer with a new identity joins; once it has committed a round and one more
  after it, it is SIGKILLed (its whole process group: a crash);
* ``restarted``: the same volunteer started again with the same ``--identity``; once it has committed
  a round it is SIGTERMed and its ``--json`` summary gives the ledger's ``state`` bytes.

Each volunteer runs the ordinary CLI with this package's INFO lines on (the peer loop logs when the
node is up, each state download with its size, training start, late and committed rounds), so each
phase is timed from the log: process start (launch -> node up), catch-up (node up -> training
starts, the downloads included), then training until the first committed round (with the rounds it
arrived late for). Prints a table and writes ``benchmarks/results/rejoin.json``.

    python benchmarks/rejoin.py               # about 4 minutes on 2 CPU cores
    python benchmarks/rejoin.py --inner-steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import RESULTS, recorded, write_report  # noqa: E402

from peers import PeerProcess, find_orphans, spawn_command  # noqa: E402

LOOP = ["--host-maddrs", "/ip4/127.0.0.1/tcp/0"]
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the CLI's own format
#: the CLI with this project's INFO lines on (the CLI's basicConfig is then a no-op), and a first line
#: written before the heavy imports (``interpreter``: Python itself is up)
WRAPPER = f"""
import logging, sys
logging.basicConfig(level=logging.WARNING, format={FORMAT!r})
for name in ("swarmtrain", "peers"):
    logging.getLogger(name).setLevel(logging.INFO)
logging.getLogger("rejoin-bench").warning("interpreter up")
from swarmtrain.app.cli import main
sys.argv[0] = "swarmtrain"
main()
"""
SW_LOGGED = [sys.executable, "-c", WRAPPER]
SW = [sys.executable, "-m", "swarmtrain"]

#: log events of a volunteer: name -> pattern (first group: round where it has one)
EVENTS = {
    "interpreter": r"interpreter up",
    "node_up": r"peer \S+ up, role trainer",
    "download": r"downloaded state of round (\d+) \((\d+) bytes\)",
    "chunks": r"state of \d+ bytes in (\d+) chunks from (\d+) donors",  # peers.state.state_chunks
    "adopted": r"adopted the swarm's state: step \d+, round (\d+)",
    "own_state": r"resumed from its own saved state of round (\d+)",
    "training": r"training from step \d+, round (\d+)",
    "late": r"round (-?\d+) went on without this peer",
    "failed": r"round (-?\d+) \(\w+\) failed: (?!late:)(.{0,120})",  # late: the loop's own line
    "committed": r"round (\d+) committed",
}
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "SWARMTRAIN_TRAIN__THREADS": "1",
            # open with the mean on loopback (a trusted network), as tests/integration/test_join.py
            "SWARMTRAIN_PEERS__OPEN_UNPROTECTED": "true",
            "SWARMTRAIN_TRAIN__EVAL_INTERVAL": "100000",
            "SWARMTRAIN_TRAIN__BATCH_SIZE": "8",
            "SWARMTRAIN_TRAIN__EVAL_BATCHES": "4",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def events(log: str, t0: float) -> list[tuple[float, str, tuple[str, ...]]]:
    """``(seconds since t0, event name, groups)`` of each matching line of ``log``, in order."""
    out = []
    for line in log.splitlines():
        m = _STAMP.match(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - t0
        for name, pat in EVENTS.items():
            e = re.search(pat, line)
            if e:
                out.append((round(t, 2), name, e.groups()))
                break
    return out


def breakdown(evs: list[tuple[float, str, tuple[str, ...]]]) -> dict[str, Any]:
    """The phases up to the first committed round, from one volunteer's events."""

    def first(name: str) -> float | None:
        return next((t for t, n, _ in evs if n == name), None)

    commit = first("committed")
    before = [e for e in evs if commit is None or e[0] <= commit]
    downloads = [{"t_s": t, "round": int(g[0]), "bytes": int(g[1])} for t, n, g in before if n == "download"]
    node_up, training = first("node_up"), first("training")
    return {
        "first_commit_s": commit,
        "interpreter_s": first("interpreter"),
        "node_up_s": node_up,
        "training_start_s": training,
        "catch_up_s": None if node_up is None or training is None else round(training - node_up, 2),
        "training_to_commit_s": None if commit is None or training is None else round(commit - training, 2),
        "late_rounds": [int(g[0]) for _, n, g in before if n == "late"],
        "failed_rounds": [[int(g[0]), g[1]] for _, n, g in before if n == "failed"],
        "downloads": downloads,
        "state_bytes_logged": sum(d["bytes"] for d in downloads),
        "chunked": [{"chunks": int(g[0]), "donors": int(g[1])} for _, n, g in before if n == "chunks"],
        "own_state_loaded": any(n == "own_state" for _, n, _ in before),
        "events": [[t, n, *g] for t, n, g in evs][:60],
    }


class Run:
    """The bootstrap and volunteers of one benchmark run, in ``tmp``."""

    def __init__(self, tmp: Path, run_id: str, common: list[str]) -> None:
        self.tmp, self.run_id, self.common = tmp, run_id, common
        self.procs: list[PeerProcess] = []
        self.maddr = ""

    def start_dht(self) -> None:
        out = self.tmp / "dht.out"
        self.procs.append(
            spawn_command([*SW, "dht", *LOOP, "--run-id", self.run_id], env=_env(), stdout=out.open("w"))
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            m = re.search(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)", out.read_text())
            if m:
                self.maddr = m.group(1)
                return
            time.sleep(0.2)
        raise SystemExit("the bootstrap printed no address")

    def join(self, name: str, key: Path) -> tuple[PeerProcess, float]:
        argv = [*SW_LOGGED, "join", "--initial-peers", self.maddr, "--run-id", self.run_id, *LOOP]
        argv += [*self.common, "--identity", str(key), "--json", str(self.tmp / f"{name}.json")]
        err = (self.tmp / f"{name}.err").open("w")
        t0 = time.time()
        p = spawn_command(argv, env=_env(), stdout=(self.tmp / f"{name}.out").open("w"), stderr=err)
        self.procs.append(p)
        return p, t0

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.err").read_text(errors="replace")

    def wait_commits(self, name: str, p: PeerProcess, n: int, timeout: float) -> None:
        """Until ``name`` logged ``n`` committed rounds (SystemExit when it died or took too long)."""
        deadline = time.monotonic() + timeout
        while len(re.findall(EVENTS["committed"], self.log(name))) < n:
            if not p.alive or time.monotonic() > deadline:
                why = "exited" if not p.alive else f"no {n} committed rounds in {timeout:.0f} s"
                raise SystemExit(f"{name} {why}; log tail:\n{self.log(name)[-2500:]}")
            time.sleep(0.2)

    def close(self) -> int:
        for p in self.procs:
            p.terminate(grace=5.0)
        return len([o for p in self.procs for o in find_orphans(p.marker)])


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from peers.keys.identity import ensure_identity

    common = ["-s", "diloco", "-H", str(args.inner_steps), "--compressor", "int8", "--steps", "100000"]
    keys = {n: tmp / f"key_{n}" for n in "abc"}
    for k in keys.values():
        ensure_identity(k)
    run = Run(tmp, "rejoin-bench", common)
    try:
        run.start_dht()
        a, _ = run.join("a", keys["a"])
        b, _ = run.join("b", keys["b"])
        run.wait_commits("a", a, args.warmup, args.timeout)
        run.wait_commits("b", b, args.warmup, args.timeout)

        c, t_fresh = run.join("c", keys["c"])  # fresh: a new identity, nothing saved
        run.wait_commits("c", c, 2, args.timeout)
        fresh = breakdown(events(run.log("c"), t_fresh))
        os.killpg(c.pid, signal.SIGKILL)  # a crash: the main process and its daemon
        c.join(30)
        time.sleep(args.down_s)

        c2, t_restart = run.join("c2", keys["c"])  # same identity
        run.wait_commits("c2", c2, 1, args.timeout)
        restarted = breakdown(events(run.log("c2"), t_restart))
        c2.signal(signal.SIGTERM)
        c2.join(120)
        summary = json.loads((tmp / "c2.json").read_text()) if (tmp / "c2.json").exists() else {}
        by_kind = summary.get("ledger", {}).get("by_kind", {})
        restarted["state_bytes_ledger"] = by_kind.get("state", {}).get("received")
        restarted["downloads_json"] = len(summary.get("downloads", []))
    finally:
        orphans = run.close()
    return {"fresh": fresh, "restarted": restarted, "orphans": orphans}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inner-steps", type=int, default=10, help="DiLoCo H of the run")
    ap.add_argument("--warmup", type=int, default=2, help="rounds the first two commit before measuring")
    ap.add_argument("--down-s", type=float, default=0.0, help="seconds the killed volunteer stays down")
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds for each wait")
    ap.add_argument("--out", type=Path, default=RESULTS / "rejoin.json")
    ap.add_argument(
        "--label", default="current", help="the entry of the JSON this run replaces (e.g. before, after)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rejoin-bench-") as tmp:
        res = measure(args, Path(tmp))
    head = f"{'volunteer':<11}{'1st commit s':>13}{'node up s':>10}{'catch-up s':>11}{'train s':>8}"
    print(head + f"{'late':>5}{'failed':>7}{'downloads':>10}{'state MiB':>10}")
    for name in ("fresh", "restarted"):
        r = res[name]
        print(
            f"{name:<11}{_fmt(r['first_commit_s']):>13}{_fmt(r['node_up_s']):>10}{_fmt(r['catch_up_s']):>11}"
            f"{_fmt(r['training_to_commit_s']):>8}{len(r['late_rounds']):>5}{len(r['failed_rounds']):>7}"
            f"{len(r['downloads']):>10}"
            f"{r['state_bytes_logged'] / 2**20:>10.1f}"
        )
    entry = {
        "recorded": recorded(),
        "preset": "tiny",
        "strategy": "diloco",
        "inner_steps": args.inner_steps,
        "codec": "int8",
        "donors": 2,
        **res,
    }
    old = json.loads(args.out.read_text()) if args.out.exists() else {}
    runs = old.get("runs", {}) if old.get("benchmark") == "rejoin" else {}
    result = {"benchmark": "rejoin", "runs": {**runs, args.label: entry}}
    write_report(args.out, result)


if __name__ == "__main__":
    main()
