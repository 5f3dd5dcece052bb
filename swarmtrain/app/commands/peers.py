"""``swarmtrain dht`` (a bootstrap node) and ``swarmtrain status`` (a table of a run's live peers).

``dht`` starts a hivemind DHT node, prints the multiaddrs other peers pass as ``--initial-peers``
(one per line after a header, flushed at once so scripts can read them) and runs until Ctrl-C or
SIGTERM, then deregisters. ``status`` joins the DHT as a client, reads the run's peer records and
prints them as a rich table. Heavy imports (hivemind, torch) happen inside the commands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:  # imported for real inside the commands, so --help stays fast
    from rich.table import Table

    from peers.records import PeerRecord

__all__ = ["register", "dht", "status", "split_maddrs", "human_bytes"]


def split_maddrs(values: list[str] | None) -> list[str]:
    """Flags may repeat or hold comma/space separated lists: flatten them."""
    out: list[str] = []
    for v in values or []:
        out += [x for x in v.replace(",", " ").split() if x]
    return out


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _peers_config(config: Path | None, overrides: dict[str, Any]) -> Any:
    """``[peers]`` of the run's config file (if any) under the command's flags (``None``: not given)."""
    from swarmtrain.core.config import load_config

    return load_config(config, overrides).peers


_CONFIG_HELP = "The run's TOML config (its [peers] admission settings and run ID)."
_TOKEN_HELP = "This peer's join token (runs with admission 'token'; `swarmtrain token issue`)."


def dht(
    host_maddrs: list[str] | None = typer.Option(
        None, "--host-maddrs", help="Multiaddrs to listen on (default /ip4/0.0.0.0/tcp/0)."
    ),
    announce_maddrs: list[str] | None = typer.Option(
        None, "--announce-maddrs", help="Public multiaddrs to announce (behind NAT / port forwarding)."
    ),
    initial_peers: list[str] | None = typer.Option(None, "--initial-peers", help="Other bootstrap nodes."),
    identity: str | None = typer.Option(
        None,
        "--identity",
        help="Private key file; created if missing; keeps the peer ID across restarts.",
    ),
    run_id: str | None = typer.Option(None, "--run-id", help="Run ID to announce the node under."),
    config: Path | None = typer.Option(None, "--config", "-c", help=_CONFIG_HELP),
    token: str | None = typer.Option(None, "--token", help=_TOKEN_HELP),
) -> None:
    """Run a bootstrap DHT node and print the multiaddrs to pass as --initial-peers."""
    from peers.node import PeerNode
    from peers.process import GracefulExit

    cfg = _peers_config(
        config,
        {
            "peers.run_id": run_id,
            "peers.initial_peers": split_maddrs(initial_peers) or None,
            "peers.host_maddrs": split_maddrs(host_maddrs) or None,
            "peers.announce_maddrs": split_maddrs(announce_maddrs) or None,
            "peers.identity_path": identity,
            "peers.token": token,
        },
    )
    with GracefulExit() as stop, PeerNode(cfg, role="bootstrap") as node:
        typer.echo(f"peer id: {node.peer_id}")
        typer.echo("initial peers (pass one or more as --initial-peers):")
        for m in node.visible_maddrs:
            typer.echo(f"  {m}")
        sys.stdout.flush()  # scripts read the multiaddrs while the node keeps running
        stop.wait()
        typer.echo("shutting down")


def status(
    initial_peers: list[str] = typer.Option(..., "--initial-peers", help="Any peer of the run."),
    run_id: str | None = typer.Option(None, "--run-id", help="Run whose peers to list."),
    config: Path | None = typer.Option(None, "--config", "-c", help=_CONFIG_HELP),
    timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait for the DHT."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    tolerate: int = typer.Option(
        1, "--tolerate", min=0, help="f of the run's ban rule (bans need f + 1 accusers)."
    ),
    strikes: int = typer.Option(3, "--ban-strikes", min=1, help="The run's peers.ban_strikes."),
) -> None:
    """Print a table of the run's live peers (ID, role, region, progress, bytes, version) and exit.

    Below it: the peers banned by the run's signed suspicion records, and why.
    """
    from dataclasses import asdict

    from rich.console import Console

    from peers.guard import read_tables
    from peers.node import PeerNode
    from peers.suspicion import compute_bans
    from swarmtrain.core.jsonsafe import dumps

    overrides = {
        "peers.run_id": run_id,
        "peers.initial_peers": split_maddrs(initial_peers),
        "peers.host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
        "peers.identity_path": None,
        "peers.token": None,
    }
    cfg = _peers_config(config, overrides)
    cfg = cfg.model_copy(update={"identity_path": None, "token": None})  # a monitor writes nothing
    with PeerNode(
        cfg, role="monitor", client_mode=True, publish_record=False, startup_timeout=timeout
    ) as node:
        records = node.live_peers(timeout=timeout)
        bans = compute_bans(read_tables(node.dht, cfg.run_id, timeout), tolerate, strikes=strikes)
    if json_out:
        rows = [{**asdict(r), "banned": bans.get(r.peer_id)} for r in records]
        typer.echo(dumps(rows, default=str))
        return
    Console(width=160).print(_peer_table(cfg.run_id, records))
    for peer, why in sorted(bans.items()):
        typer.echo(f"banned {peer}: {why}")
    if not bans:
        typer.echo("banned: none")


_COLUMNS = ("peer", "role", "region", "step", "round", "throughput", "loss", "up", "down", "version", "seen")
_NUMERIC = frozenset({"step", "round", "throughput", "up", "down"})


def _peer_table(run_id: str, records: list[PeerRecord]) -> Table:
    """A rich table of peer records, one row each (``status``'s output)."""
    from rich.table import Table

    from peers.node import dht_time

    now = dht_time()
    table = Table(title=f"run {run_id!r}: {len(records)} live peer(s)")
    for col in _COLUMNS:
        table.add_column(col, justify="right" if col in _NUMERIC else "left")
    for r in records:
        table.add_row(
            r.peer_id[-12:],
            r.role,
            r.region,
            str(r.step),
            str(r.round),
            f"{r.throughput:.1f}",
            "-" if r.loss != r.loss else f"{r.loss:.4f}",  # NaN: no loss reported yet
            human_bytes(r.bytes_sent),
            human_bytes(r.bytes_received),
            r.version,
            f"{max(now - r.time, 0):.0f}s ago" if r.time else "-",
        )
    return table


def register(app: typer.Typer) -> None:
    """Add the ``dht`` and ``status`` commands to ``app``."""
    app.command("dht")(dht)
    app.command("status")(status)
