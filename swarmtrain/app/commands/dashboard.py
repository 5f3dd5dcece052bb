"""``swarmtrain dashboard``: serve a local web page that shows a run live.

Joins the DHT as a read-only monitor (like ``status``: a client that publishes nothing), polls the
run's peer records and suspicion records every ``--interval`` seconds and serves the page at
``http://HOST:PORT/`` until Ctrl-C or SIGTERM. It prints one line with the URL once everything is up
(flushed, so scripts can read it). Heavy imports happen inside the command.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:  # imported for real inside the functions, so --help stays fast
    from swarmtrain.app.dashboard import DashboardServer, History

__all__ = ["register", "dashboard"]


_InitialPeers = Annotated[
    list[str], typer.Option("--initial-peers", help="Any peer of the run (repeatable).")
]
_RunId = Annotated[str | None, typer.Option("--run-id", help="Run to show.")]
_Config = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="The run's TOML config (its [peers] admission settings and run ID)."),
]
_Port = Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to serve on (0: any free port).")]
_Host = Annotated[
    str, typer.Option("--host", help="Address to serve on (the default keeps the page on this machine).")
]
_Interval = Annotated[float, typer.Option("--interval", help="Seconds between reads of the run's records.")]
_Timeout = Annotated[
    float, typer.Option("--timeout", help="Seconds to wait for the DHT (start and each read).")
]
_Tolerate = Annotated[
    int, typer.Option("--tolerate", min=0, help="f of the run's ban rule (bans need f + 1 accusers).")
]
_Strikes = Annotated[int, typer.Option("--ban-strikes", min=1, help="The run's peers.ban_strikes.")]


def dashboard(
    initial_peers: _InitialPeers,
    run_id: _RunId = None,
    config: _Config = None,
    port: _Port = 8470,
    host: _Host = "127.0.0.1",
    interval: _Interval = 2.0,
    timeout: _Timeout = 30.0,
    tolerate: _Tolerate = 1,
    strikes: _Strikes = 3,
) -> None:
    """Serve a live web page of the run: peers, loss curve, bytes per round, round outcomes, bans.

    The page is self-contained (no external assets; works offline) and reads the same records as
    `swarmtrain status`. Runs until Ctrl-C.
    """
    import time

    from swarmtrain.app.commands.peers import _peers_config, split_maddrs
    from swarmtrain.app.dashboard import DashboardServer, History
    from swarmtrain.core.errors import ConfigError

    if not (math.isfinite(interval) and interval > 0):
        raise ConfigError(f"--interval must be a positive number of seconds, not {interval}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(f"--timeout must be a positive number of seconds, not {timeout}")
    maddrs = split_maddrs(initial_peers)
    if not maddrs:
        raise ConfigError("--initial-peers: give the multiaddr of at least one peer of the run")
    cfg = _peers_config(config, {"peers.run_id": run_id, "peers.initial_peers": maddrs})
    history = History(cfg.run_id)
    try:
        server = DashboardServer(host, port, lambda: history.snapshot(time.time()))
    except OSError as e:
        raise ConfigError(f"cannot serve the dashboard on {host}:{port}: {e.strerror or e}") from None
    try:
        _serve(cfg, server, history, interval, timeout, tolerate, strikes)
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
