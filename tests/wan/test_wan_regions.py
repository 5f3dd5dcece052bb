"""Opt-in (``SWARMTRAIN_WAN=1``, root): ``simulate --topology``'s emulated regions.

Checked here, on ``examples/topologies/three_regions.toml`` (10 ms inside a region, 80-150 ms
between, 50 Mbit/s per peer): a ping-like round trip between regions through the delay proxy is the
configured RTT (never less; more by at most a generous margin for load), nodes cannot reach each
other except through the proxy, the rate cap holds through the proxy, the namespaces go away on a
normal exit, SIGTERM and Ctrl-C, a SIGKILLed run's leftovers are removed by the next run, a second run
cannot build over a live one; and a 3-peer ``swarmtrain simulate --topology`` run ends with identical
parameters, every peer's bytes having gone through the proxy; SIGTERM or SIGKILL of that command
mid-run leaves no process of it in the regions (and, after SIGKILL, namespaces the next run removes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmtrain.core.errors import SwarmError
from swarmtrain.simulation.netns import run_cmd, socket_in
from swarmtrain.simulation.regions import EmulatedRegions, leftover_namespaces
from swarmtrain.simulation.topology import P2P_PORT, load_topology

pytestmark = [
    pytest.mark.wan,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and tc need root (euid 0)"),
]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "topologies" / "three_regions.toml"
# a round trip through the proxy may take longer than configured (scheduling of a loaded machine,
# the proxy's own hops), never shorter; this is only a bound against a delay applied twice or not at all
SLACK_MS = 40.0

HOLD = """
import sys, time
from swarmtrain.simulation.regions import EmulatedRegions
from swarmtrain.simulation.topology import load_topology
with EmulatedRegions(load_topology(sys.argv[1]), 3):
    print("ready", flush=True)
    time.sleep(600)
"""


def _hold() -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(EXAMPLE)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_rtt_between_regions_is_the_configured_one() -> None:
    topo = load_topology(EXAMPLE)
    with EmulatedRegions(topo, 4) as net:  # peers: us-east, eu-west, ap-south, us-east
        assert len(leftover_namespaces()) == 6  # the hub and 5 nodes
        for a, b in [(1, 2), (1, 3), (2, 3), (1, 4), (3, 1)]:
            want = topo.rtt_ms(net.nodes[a].region, net.nodes[b].region)
            got = net.rtt_ms(a, b)
            assert want * 0.99 <= got <= want + SLACK_MS, (a, b, want, got)
        assert net.proxy is not None and net.proxy.connections >= 5
    assert leftover_namespaces() == []


def test_nodes_reach_each_other_only_through_the_proxy_and_the_cap_holds() -> None:
    with EmulatedRegions(load_topology(EXAMPLE), 2) as net:
        a, b = net.nodes[1], net.nodes[2]
        direct = socket_in(a.ns)
        direct.settimeout(5)
        with pytest.raises(OSError):  # no route from one node to another's own address
            direct.connect((b.ip, P2P_PORT))
        direct.close()
        assert net.fabric is not None
        assert "tbf" in net.fabric.qdiscs(1) and "50Mbit" in net.fabric.qdiscs(1)
        nbytes = 2_000_000
        secs = net.fabric.transfer(1, 2, nbytes, port=P2P_PORT, host=b.proxy_ip)
        floor = (nbytes * 8 - 64_000) / 50e6
        assert secs >= 0.9 * floor, f"{nbytes} B in {secs:.3f} s beats a 50 Mbit/s cap"
    assert leftover_namespaces() == []


def test_routes_pin_their_congestion_control_and_an_all_to_all_crosses_the_caps() -> None:
    """Every route of the emulated network names ``cubic`` (with the host's BBR the capped hop's
    near-zero base RTT left a third of the link idle under two flows: ``docs/decisions.md``), and
    ``all_to_all_s`` moves every byte, never faster than the caps allow."""
    with EmulatedRegions(load_topology(EXAMPLE), 3) as net:
        assert net.fabric is not None
        for ns in [net.fabric.hub, *(n.ns for n in net.nodes)]:
            routes = run_cmd("ip", "-n", ns, "route", "show").stdout.splitlines()
            assert routes and all("congctl cubic" in r for r in routes), (ns, routes)
        nodes = [net.plan.node_of_rank(r).index for r in range(3)]
        nbytes = 1_000_000
        secs = net.all_to_all_s(nodes, nbytes)
        floor = (2 * nbytes * 8 - 64_000) / 50e6  # each node sends 2 x nbytes through its 50 Mbit/s cap
        assert secs >= 0.9 * floor, f"all-to-all in {secs:.3f} s beats a 50 Mbit/s cap"
    assert leftover_namespaces() == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_removes_the_regions(sig: signal.Signals) -> None:
    proc = _hold()
    try:
        assert leftover_namespaces() != []
        proc.send_signal(sig)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert leftover_namespaces() == []
    assert proc.returncode != 0


def test_a_live_run_holds_the_lock_and_a_killed_runs_leftovers_are_removed() -> None:
    proc = _hold()
    try:
        with pytest.raises(SwarmError, match="holds the emulated regions"):
            EmulatedRegions(load_topology(EXAMPLE), 2).__enter__()
        assert len(leftover_namespaces()) == 5  # the live run's, untouched
        proc.kill()  # SIGKILL: no cleanup runs, the namespaces stay
        proc.wait(30)
        assert len(leftover_namespaces()) == 5
        with EmulatedRegions(load_topology(EXAMPLE), 2) as net:
            assert len(leftover_namespaces()) == 4  # the old ones gone, its own built
            assert net.rtt_ms(1, 2) >= 80 * 0.99
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert leftover_namespaces() == []


@pytest.mark.slow
def test_simulate_over_three_regions_ends_identical(tmp_path: Path) -> None:
    out = tmp_path / "regions.json"
    argv = [
        sys.executable, "-m", "swarmtrain", "simulate", "--peers", "3", "--steps", "20", "-H", "10",
        "--topology", str(EXAMPLE), "--json", str(out), "--timeout", "600",
    ]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert leftover_namespaces() == []
    doc = json.loads(out.read_text())
    assert doc["params_identical"] is True
    rounds = doc["rounds_per_peer"]
    assert all(r["committed"] == 2 and r["failed"] == 0 for r in rounds), rounds
    topo = doc["topology"]
    assert topo["regions"] == {"us-east": [0], "eu-west": [1], "ap-south": [2]}
    for pair, got in topo["rtt_ms_measured"].items():
        want = topo["rtt_ms_configured"][pair]
        assert want * 0.99 <= got <= want + SLACK_MS, (pair, want, got)
    # every byte a peer sent to another went through the proxy (it also carries the DHT's traffic)
    assert topo["proxy_bytes"] >= 3 * doc["bytes_sent_per_peer"]
    assert doc["final_val_loss"] < 5.0


def _pids_in_regions() -> set[int]:
    out: set[int] = set()
    for ns in leftover_namespaces():
        got = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=False)
        out.update(int(x) for x in got.stdout.split())
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_simulate_killed_mid_run_leaves_no_process_and_no_network(sig: signal.Signals) -> None:
    argv = [
        sys.executable, "-m", "swarmtrain", "simulate", "--peers", "2", "--steps", "2000",
        "--topology", str(EXAMPLE), "--timeout", "600",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300  # hang guard: the peers are up well before
        pids: set[int] = set()
        while len(pids) < 6 and time.monotonic() < deadline:  # 3 nodes x (process, DHT, p2pd) at least
            time.sleep(1)
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            pids = _pids_in_regions()
        assert len(pids) >= 6, pids
        time.sleep(3)
        pids = _pids_in_regions()
        proc.send_signal(sig)
        proc.wait(60)
        end = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < end:
            time.sleep(0.5)
        assert not [p for p in pids if _alive(p)]
        if sig == signal.SIGKILL:  # nothing could clean up: the next run does
            assert leftover_namespaces() != []
            with EmulatedRegions(load_topology(EXAMPLE), 1):
                pass
        assert leftover_namespaces() == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
