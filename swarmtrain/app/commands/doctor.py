"""``swarmtrain doctor``: is this machine ready for a run, and which role suits it?

Checks that the p2p daemon starts; with ``--initial-peers``, joins the run's DHT as a read-only
monitor, measures RTT and bandwidth to a few live peers (their ``peers.dht.probe`` handlers) and asks
libp2p's AutoNAT whether others can dial this machine; then times a few training steps of the run's
preset on CPU (and CUDA where present) and sets free memory against the model's budget. Prints a
table and a verdict, or JSON with ``--json``. Exit status 1 when a check failed outright.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

__all__ = ["register", "doctor"]

_NO_PEERS = "no --initial-peers"


def _manifest_settings(maddrs: list[str], timeout: float) -> dict[str, object] | None:
    """The run-wide settings of the manifest the initial peer serves (its run ID and policy), or None
    when it serves none (a run made without ``run init``): the doctor then checks the default run."""
    from peers.dht.manifest_fetch import fetch_manifest
    from swarmtrain.core.errors import SwarmError

    try:
        manifest, _, _ = fetch_manifest(maddrs, timeout)
    except SwarmError:
        return None
    return manifest.settings


def doctor(
    initial_peers: list[str] | None = typer.Option(
        None, "--initial-peers", help="Any peer of the run (repeatable); without: local checks only."
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="The run's TOML config (preset, run ID)."
    ),
    run_id: str | None = typer.Option(None, "--run-id", help="The run to check against."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    n_peers: int = typer.Option(3, "--peers", min=0, max=16, help="How many live peers to probe."),
    timeout: float = typer.Option(30.0, "--timeout", min=1.0, help="Seconds for each network step."),
) -> None:
    """Check this machine for a run (p2p, reachability, links, throughput, memory); print a verdict."""
    import torch

    from peers.wire.transport import LoopThread
    from swarmtrain.app.commands.peers import split_maddrs
    from swarmtrain.app.doctor.local import check_daemon, check_memory, check_throughput
    from swarmtrain.app.doctor.network import check_run
    from swarmtrain.app.doctor.reachability import ReachabilityWatch, reachability_check
    from swarmtrain.app.doctor.result import Check
    from swarmtrain.app.doctor.verdict import decide, format_report, report_dict
    from swarmtrain.core.config import load_config
    from swarmtrain.core.jsonsafe import dumps

    maddrs = split_maddrs(initial_peers)
    base = _manifest_settings(maddrs, timeout) if maddrs and config is None and run_id is None else None
    cfg = load_config(
        config,
        {
            "peers.run_id": run_id,
            "peers.initial_peers": maddrs or None,
            "peers.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
        },
        base=base,
    )
    peers_cfg = cfg.peers.model_copy(update={"identity_path": None, "token": None})  # writes nothing
    checks: list[Check] = []

    def progress(what: str) -> None:
        if not json_out:
            print(f"... {what}", file=sys.stderr, flush=True)

    progress("starting the p2p daemon")
    checks.append(check_daemon(timeout))
    peer_throughput: list[float] = []
    watch: ReachabilityWatch | None = None
    loop: LoopThread | None = None
    try:
        if maddrs and checks[0].status != "fail":
            progress("asking AutoNAT about this machine (in the background)")
            loop = LoopThread("swarmtrain-doctor")
            watch = ReachabilityWatch(maddrs, loop)
            watch.start(timeout)
            progress(f"joining run {peers_cfg.run_id!r} and probing up to {n_peers} peer(s)")
            links = check_run(peers_cfg, n_peers=n_peers, timeout=timeout)
            checks += links.checks
            peer_throughput = links.peer_throughput
        elif not maddrs:
            for name in ("reachability", "dht", "peers"):
                checks.append(Check(name, "skip", "-", f"skipped: {_NO_PEERS}"))
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        for dev in devices:
            progress(f"timing training steps of {cfg.model.preset!r} on {dev}")
            checks.append(check_throughput(cfg, dev))
        checks.append(check_memory(cfg, "cuda" in devices))
        if watch is not None:
            progress("waiting for AutoNAT's answer")
            checks.insert(1, reachability_check(watch.result(min(timeout, 20.0))))
    finally:
        if watch is not None:
            watch.close()
        if loop is not None:
            loop.stop()
    verdict = decide(checks, peer_throughput)
    if json_out:
        typer.echo(dumps(report_dict(checks, verdict, run_id=peers_cfg.run_id, preset=cfg.model.preset)))
    else:
        typer.echo(format_report(checks, verdict))
    if verdict.exit_code:
        raise typer.Exit(verdict.exit_code)


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to ``app``."""
    app.command("doctor")(doctor)
