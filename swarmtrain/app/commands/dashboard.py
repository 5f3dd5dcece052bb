"""``swarmtrain dashboard``: serve a local web page that shows a run live.

Joins the DHT as a read-only monitor (like ``status``: a client that publishes nothing), polls the
run's peer records and suspicion records every ``--interval`` seconds and serves the page at
``http://HOST:PORT/`` until Ctrl-C or SIGTERM. It prints one line with the URL once everything is up
(flushed, so scripts can read it). Heavy imports happen inside the command.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from swarmtrain.app.commands.flags import command, config_overrides, flag
from swarmtrain.app.commands.peers import given_maddrs

if TYPE_CHECKING:  # imported for real inside the functions, so --help stays fast
    from swarmtrain.app.dashboard import DashboardServer, History

__all__ = ["register", "dashboard", "DashboardOptions"]


@dataclass(frozen=True)
class DashboardOptions:
    """What ``swarmtrain dashboard`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``; ``None``: not given). ``--tolerate`` and ``--ban-strikes``
    are the dashboard's own: the ban rule it reads the run's records with."""

    initial_peers: list[str] = flag(
        ...,
        "--initial-peers",
        key="peers.initial_peers",
        convert=given_maddrs,
        help="Any peer of the run (repeatable).",
    )
    run_id: str | None = flag(None, "--run-id", key="peers.run_id", help="Run to show.")
    config: Path | None = flag(
        None,
        "--config",
        "-c",
        help="The run's TOML config (its [peers] admission settings and run ID).",
    )
    port: int = flag(8470, "--port", min=0, max=65535, help="Port to serve on (0: any free port).")
    host: str = flag(
        "127.0.0.1", "--host", help="Address to serve on (the default keeps the page on this machine)."
    )
    interval: float = flag(2.0, "--interval", help="Seconds between reads of the run's records.")
    timeout: float = flag(30.0, "--timeout", help="Seconds to wait for the DHT (start and each read).")
    tolerate: int = flag(1, "--tolerate", min=0, help="f of the run's ban rule (bans need f + 1 accusers).")
    strikes: int = flag(3, "--ban-strikes", min=1, help="The run's peers.ban_strikes.")


@command(DashboardOptions)
def dashboard(opts: DashboardOptions) -> None:
    """Serve a live web page of the run: peers, loss curve, bytes per round, round outcomes, bans.

    The page is self-contained (no external assets; works offline) and reads the same records as
    `swarmtrain status`. Runs until Ctrl-C.
    """
    import time

    from swarmtrain.app.commands.peers import _peers_config
    from swarmtrain.app.dashboard import DashboardServer, History
    from swarmtrain.core.errors import ConfigError

    if not (math.isfinite(opts.interval) and opts.interval > 0):
        raise ConfigError(f"--interval must be a positive number of seconds, not {opts.interval}")
    if not (math.isfinite(opts.timeout) and opts.timeout > 0):
        raise ConfigError(f"--timeout must be a positive number of seconds, not {opts.timeout}")
    overrides = config_overrides(opts)
    if not overrides["peers.initial_peers"]:
        raise ConfigError("--initial-peers: give the multiaddr of at least one peer of the run")
    by_manifest = opts.config is None and opts.run_id is None  # the run of the served manifest
    cfg = _peers_config(opts.config, overrides, by_manifest=by_manifest)
    history = History(cfg.run_id)
    host, port = opts.host, opts.port
    try:
        server = DashboardServer(host, port, lambda: history.snapshot(time.time()))
    except OSError as e:
        raise ConfigError(f"cannot serve the dashboard on {host}:{port}: {e.strerror or e}") from None
    try:
        _serve(cfg, server, history, opts.interval, opts.timeout, opts.tolerate, opts.strikes)
    finally:
        server.close()


def _serve(
    cfg: Any,
    server: DashboardServer,
    history: History,
    interval: float,
    timeout: float,
    tolerate: int,
    strikes: int,
) -> None:
    """Join the run's DHT as a reader, poll its records into ``history`` every ``interval`` seconds and
    serve the page until Ctrl-C or SIGTERM (the URL printed, flushed, once everything is up)."""
    from peers.dht.monitor import RunReader
    from peers.dht.process import GracefulExit
    from peers.dht.records import PeerRecord
    from peers.rounds.guard import read_tables
    from peers.trust.suspicion import compute_bans
    from swarmtrain.app.dashboard import Poller

    with (
        GracefulExit(message="stopping") as stop,
        RunReader(cfg, startup_timeout=timeout) as reader,  # reads records; writes nothing
    ):

        def read() -> tuple[list[PeerRecord], dict[str, str]]:
            records = reader.live_peers(timeout=timeout)
            bans = compute_bans(read_tables(reader, cfg.run_id, timeout), tolerate, strikes=strikes)
            return records, bans

        poller = Poller(read, history, interval)
        poller.start()
        server.start()
        typer.echo(f"dashboard of run {cfg.run_id!r}: {server.url}  (Ctrl-C to stop)")
        sys.stdout.flush()  # scripts and tests read the URL while the server keeps running
        stop.wait()
        typer.echo("shutting down")
        poller.stop()


def register(app: typer.Typer) -> None:
    """Add ``dashboard`` to the CLI."""
    app.command("dashboard")(dashboard)
