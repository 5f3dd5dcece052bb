"""``swarmtrain doctor``: is this machine ready for a run, and which role suits it?

Checks that the p2p daemon starts; with ``--initial-peers``, joins the run's DHT as a read-only
monitor, measures RTT and bandwidth to a few live peers (their ``peers.dht.probe`` handlers) and asks
libp2p's AutoNAT whether others can dial this machine; then times a few training steps of the run's
preset on CPU (and CUDA where present) and sets free memory against the model's budget. Prints a
table and a verdict, or JSON with ``--json``. Exit status 1 when a check failed outright.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from swarmtrain.app.commands.flags import command, config_overrides, flag
from swarmtrain.app.commands.peers import given_maddrs

if TYPE_CHECKING:  # imported for real inside the functions, so --help stays fast
    from swarmtrain.app.doctor.result import Check

__all__ = ["register", "doctor", "DoctorOptions"]

_NO_PEERS = "no --initial-peers"


def _manifest(maddrs: list[str], timeout: float) -> Any:
    """The manifest the initial peer serves, or None when it serves none (a run made without
    ``run init``): the doctor then checks the run its config or flags name.

    Raises:
        ConfigError: the initial peer cannot be reached (the cause in one line, as ``join`` says it).
    """
    from peers.dht.manifest_fetch import NoManifest, fetch_manifest
    from swarmtrain.core.errors import ConfigError, SwarmError

    try:
        manifest, _, _ = fetch_manifest(maddrs, timeout)
    except NoManifest:
        return None
    except SwarmError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
    return manifest


@dataclass(frozen=True)
class DoctorOptions:
    """What ``swarmtrain doctor`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``; ``None``: not given)."""

    initial_peers: list[str] | None = flag(
        None,
        "--initial-peers",
        key="peers.initial_peers",
        convert=given_maddrs,
        help="Any peer of the run (repeatable); without: local checks only.",
    )
    config: Path | None = flag(None, "--config", "-c", help="The run's TOML config (preset, run ID).")
    run_id: str | None = flag(None, "--run-id", key="peers.run_id", help="The run to check against.")
    identity: str | None = flag(
        None,
        "--identity",
        key="peers.identity_path",
        help="Private key file, as for join (default under token: this machine's, if it exists).",
    )
    token: str | None = flag(
        None,
        "--token",
        key="peers.token",
        help="Join token, as for join: admitted, the run's peers answer probes.",
    )
    json_out: bool = flag(False, "--json", help="Print JSON instead of a table.")
    n_peers: int = flag(3, "--peers", min=0, max=16, help="How many live peers to probe.")
    timeout: float = flag(30.0, "--timeout", min=1.0, help="Seconds for each network step.")


@command(DoctorOptions)
def doctor(opts: DoctorOptions) -> None:
    """Check this machine for a run (p2p, reachability, links, throughput, memory); print a verdict."""
    from swarmtrain.app.doctor.verdict import decide, format_report, report_dict
    from swarmtrain.core.jsonsafe import dumps

    overrides = config_overrides(opts)
    maddrs: list[str] = overrides["peers.initial_peers"] or []
    cfg = _doctor_config(opts, overrides)
    peers_cfg = _doctor_peer(cfg.peers)

    def progress(what: str) -> None:
        if not opts.json_out:
            print(f"... {what}", file=sys.stderr, flush=True)

    checks, peer_throughput = _run_checks(cfg, peers_cfg, maddrs, opts.n_peers, opts.timeout, progress)
    verdict = decide(checks, peer_throughput)
    if opts.json_out:
        typer.echo(dumps(report_dict(checks, verdict, run_id=peers_cfg.run_id, preset=cfg.model.preset)))
    else:
        typer.echo(format_report(checks, verdict))
    if verdict.exit_code:
        raise typer.Exit(verdict.exit_code)


def _doctor_config(opts: DoctorOptions, overrides: dict[str, Any]) -> Any:
    """The run's config: the file and flags, over the settings of the manifest the initial peer serves
    when neither names the run; the doctor's own node listens on 127.0.0.1 only.

    Raises:
        ConfigError: the initial peer cannot be reached, or a token the manifest's key did not sign.
    """
    from swarmtrain.app.peer.token_check import check_token_signer
    from swarmtrain.core.config import load_config

    maddrs = overrides["peers.initial_peers"]
    by_manifest = maddrs and opts.config is None and opts.run_id is None
    manifest = _manifest(maddrs, opts.timeout) if by_manifest else None
    base = None if manifest is None else manifest.settings
    cfg = load_config(opts.config, {**overrides, "peers.host_maddrs": ["/ip4/127.0.0.1/tcp/0"]}, base=base)
    if manifest is not None and cfg.peers.token:
        check_token_signer(cfg.peers.token, manifest.run_id, manifest.run_public_key)
    return cfg


def _doctor_peer(peers: Any) -> Any:
    """The doctor node's peer settings: the identity and token as ``join`` takes them (this machine's
    default identity under a non-open policy, only if it exists: the doctor creates no key); without
    a token, a throwaway identity."""
    from peers.keys.identity import default_identity_path

    identity = peers.identity_path
    if identity is None and peers.admission != "open" and default_identity_path().exists():
        identity = str(default_identity_path())
    if not peers.token and not (peers.admission == "allowlist" and identity):
        identity = None
    return peers.model_copy(update={"identity_path": identity})


def _run_checks(
    cfg: Any,
    peers_cfg: Any,
    maddrs: list[str],
    n_peers: int,
    timeout: float,
    progress: Callable[[str], None],
) -> tuple[list[Check], list[float]]:
    """Every check in the report's order (daemon, reachability, the run's links, throughput per
    device, memory) and the probed peers' throughput. AutoNAT's answer is awaited last: it runs in
    the background while the rest is measured."""
    from peers.wire.transport import LoopThread
    from swarmtrain.app.doctor.local import check_daemon
    from swarmtrain.app.doctor.network import check_run
    from swarmtrain.app.doctor.reachability import ReachabilityWatch, reachability_check
    from swarmtrain.app.doctor.result import Check

    progress("starting the p2p daemon")
    checks: list[Check] = [check_daemon(timeout)]
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
            checks += [
                Check(name, "skip", "-", f"skipped: {_NO_PEERS}") for name in ("reachability", "dht", "peers")
            ]
        checks += _local_checks(cfg, progress)
        if watch is not None:
            progress("waiting for AutoNAT's answer")
            checks.insert(1, reachability_check(watch.result(min(timeout, 20.0))))
    finally:
        if watch is not None:
            watch.close()
        if loop is not None:
            loop.stop()
    return checks, peer_throughput


def _local_checks(cfg: Any, progress: Callable[[str], None]) -> list[Check]:
    """Training throughput of the run's preset on CPU (and CUDA where present), then memory."""
    import torch

    from swarmtrain.app.doctor.local import check_memory, check_throughput

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    checks: list[Check] = []
    for dev in devices:
        progress(f"timing training steps of {cfg.model.preset!r} on {dev}")
        checks.append(check_throughput(cfg, dev))
    checks.append(check_memory(cfg, "cuda" in devices))
    return checks


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to ``app``."""
    app.command("doctor")(doctor)
