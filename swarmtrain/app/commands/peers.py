"""``swarmtrain dht`` (a bootstrap node) and ``swarmtrain status`` (a table of a run's live peers).

``dht`` starts a hivemind DHT node, prints the multiaddrs other peers pass as ``--initial-peers``
(one per line after a header, flushed at once so scripts can read them) and runs until Ctrl-C or
SIGTERM, then deregisters. ``status`` reads the run's peer records through an in-process DHT client
(``peers.dht.monitor.RunReader``) and prints them as a plain table. Heavy imports (hivemind, torch)
happen inside the commands.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from swarmtrain.app.commands.flags import command, config_overrides, flag

if TYPE_CHECKING:  # imported for real inside the commands, so --help stays fast
    from peers.dht.records import PeerRecord

from swarmtrain.app.units import human_bytes, short_count

__all__ = [
    "register",
    "dht",
    "status",
    "DhtOptions",
    "StatusOptions",
    "split_maddrs",
    "given_maddrs",
    "peer_rows",
    "peer_table",
]


def split_maddrs(values: list[str] | None) -> list[str]:
    """Flags may repeat or hold comma/space separated lists: flatten them."""
    out: list[str] = []
    for v in values or []:
        out += [x for x in v.replace(",", " ").split() if x]
    return out


def _served_manifest(overrides: dict[str, Any]) -> Any:
    """The manifest the initial peers serve (``None``: they serve none, a run without ``run init``).

    Raises:
        ConfigError: the initial peers cannot be reached (the cause in one line, as ``join`` says it).
    """
    from peers.dht.manifest_fetch import NoManifest, fetch_manifest
    from swarmtrain.core.errors import ConfigError, SwarmError

    try:
        return fetch_manifest(list(overrides.get("peers.initial_peers") or []))[0]
    except NoManifest:
        return None
    except SwarmError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None


def _peers_config(config: Path | None, overrides: dict[str, Any], *, by_manifest: bool = False) -> Any:
    """``[peers]`` of the run's config file (if any) under the command's flags (``None``: not given);
    with ``peers.manifest`` set, the manifest's settings are the lowest layer. With ``by_manifest``
    (``status``, ``dashboard`` given no --config and no --run-id), the run is the one whose manifest
    the initial peers serve, as for ``join``."""
    from swarmtrain.core.config import load_config

    if by_manifest and overrides.get("peers.initial_peers"):
        load_config(None, overrides)  # the command's own flags and environment: their errors first
        manifest = _served_manifest(overrides)
        if manifest is not None:
            return load_config(None, overrides, base=manifest.settings).peers
    cfg = load_config(config, overrides)
    if not cfg.peers.manifest:
        return cfg.peers
    from peers.trust.manifest import read_manifest_file
    from swarmtrain.core.errors import ConfigError

    path = cfg.peers.manifest
    manifest = read_manifest_file(path)
    if overrides.get("peers.run_id") not in (None, manifest.run_id):
        raise ConfigError(f"--run-id {overrides['peers.run_id']!r} is not the manifest's {manifest.run_id!r}")
    peers = load_config(config, overrides, base=manifest.settings).peers
    want = {
        "run_id": manifest.run_id,
        "admission": manifest.admission,
        "allowlist": list(manifest.allowlist),
        "run_public_key": manifest.run_public_key,
    }
    for key, value in want.items():
        if getattr(peers, key) != value:
            raise ConfigError(f"peers.{key} differs from the manifest's {path}: drop it from the config")
    return peers


_CONFIG_HELP = "The run's TOML config (its [peers] admission settings and run ID)."
_TOKEN_HELP = "This peer's join token (runs with admission 'token'; `swarmtrain token issue`)."


def given_maddrs(values: list[str] | None) -> list[str] | None:
    """A multiaddr flag's values as its config key's (:func:`split_maddrs`; none: ``None``, not given)."""
    return split_maddrs(values) or None


@dataclass(frozen=True)
class DhtOptions:
    """What ``swarmtrain dht`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``; ``None``: not given)."""

    host_maddrs: list[str] | None = flag(
        None,
        "--host-maddrs",
        key="peers.host_maddrs",
        convert=given_maddrs,
        help="Multiaddrs to listen on (default /ip4/0.0.0.0/tcp/0).",
    )
    announce_maddrs: list[str] | None = flag(
        None,
        "--announce-maddrs",
        key="peers.announce_maddrs",
        convert=given_maddrs,
        help="Public multiaddrs to announce (behind NAT / port forwarding).",
    )
    initial_peers: list[str] | None = flag(
        None,
        "--initial-peers",
        key="peers.initial_peers",
        convert=given_maddrs,
        help="Other bootstrap nodes.",
    )
    identity: str | None = flag(
        None,
        "--identity",
        key="peers.identity_path",
        help="Private key file; created if missing; keeps the peer ID across restarts.",
    )
    run_id: str | None = flag(None, "--run-id", key="peers.run_id", help="Run ID to announce the node under.")
    config: Path | None = flag(None, "--config", "-c", help=_CONFIG_HELP)
    token: str | None = flag(None, "--token", key="peers.token", help=_TOKEN_HELP)
    manifest: Path | None = flag(
        None,
        "--manifest",
        key="peers.manifest",
        convert=str,
        help="The run's signed manifest (`swarmtrain run init`): served to volunteers.",
    )


@command(DhtOptions)
def dht(opts: DhtOptions) -> None:
    """Run a bootstrap DHT node and print the multiaddrs to pass as --initial-peers.

    With --manifest the node serves the run's signed manifest, so volunteers need only its address
    (and a token where the run asks for one): `swarmtrain join --initial-peers ADDR`.
    """
    from peers.dht.node import PeerNode
    from peers.dht.process import GracefulExit

    cfg = _peers_config(opts.config, config_overrides(opts))
    with GracefulExit() as stop, PeerNode(cfg, role="bootstrap") as node:
        typer.echo(f"peer id: {node.peer_id}")
        typer.echo("initial peers (pass one or more as --initial-peers):")
        for m in node.visible_maddrs:
            typer.echo(f"  {m}")
        sys.stdout.flush()  # scripts read the multiaddrs while the node keeps running
        stop.wait()
        typer.echo("shutting down")


@dataclass(frozen=True)
class StatusOptions:
    """What ``swarmtrain status`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``; ``None``: not given). ``--tolerate`` and ``--ban-strikes``
    are the command's own: the ban rule it reads the run's records with."""

    initial_peers: list[str] = flag(
        ..., "--initial-peers", key="peers.initial_peers", convert=given_maddrs, help="Any peer of the run."
    )
    run_id: str | None = flag(None, "--run-id", key="peers.run_id", help="Run whose peers to list.")
    config: Path | None = flag(None, "--config", "-c", help=_CONFIG_HELP)
    timeout: float = flag(30.0, "--timeout", help="Seconds to wait for the DHT.")
    json_out: bool = flag(False, "--json", help="Print JSON instead of a table.")
    tolerate: int = flag(1, "--tolerate", min=0, help="f of the run's ban rule (bans need f + 1 accusers).")
    strikes: int = flag(3, "--ban-strikes", min=1, help="The run's peers.ban_strikes.")


@command(StatusOptions)
def status(opts: StatusOptions) -> None:
    """Print a table of the run's live peers and exit: ID, role, step, round, tokens/s, loss, bytes
    sent and received, committed/late/failed rounds, the tokens each contributed to committed rounds,
    version (fits the terminal; 80 columns piped).

    Without --config and --run-id the run is the one whose manifest the initial peer serves.

    Below it: the peers banned by the run's signed suspicion records, and why.
    """
    import shutil
    from dataclasses import asdict

    from peers.dht.monitor import RunReader
    from peers.rounds.guard import read_tables
    from peers.trust.suspicion import compute_bans
    from swarmtrain.core.jsonsafe import dumps

    by_manifest = opts.config is None and opts.run_id is None
    cfg = _peers_config(opts.config, config_overrides(opts), by_manifest=by_manifest)
    timeout = opts.timeout
    with RunReader(cfg, startup_timeout=timeout) as reader:  # reads records; writes nothing
        records = reader.live_peers(timeout=timeout)
        bans = compute_bans(read_tables(reader, cfg.run_id, timeout), opts.tolerate, strikes=opts.strikes)
    if opts.json_out:
        rows = [{**asdict(r), "banned": bans.get(r.peer_id)} for r in records]
        typer.echo(dumps(rows, default=str))
        return
    for row in peer_table(cfg.run_id, records, width=max(shutil.get_terminal_size((80, 24)).columns, 60)):
        typer.echo(row)
    for peer, why in sorted(bans.items()):
        typer.echo(f"banned {peer}: {why}")
    if not bans:
        typer.echo("banned: none")


#: (header, right-aligned) of the status table, in order; the ones in _OPTIONAL go first when the
#: table would not fit its width (least useful first)
_COLUMNS = (
    ("peer", False),
    ("role", False),
    ("region", False),
    ("step", True),
    ("round", True),
    ("tok/s", True),
    ("loss", True),
    ("sent", True),
    ("recv", True),
    ("ok/late/fail", True),
    ("tokens", True),
    ("version", False),
    ("seen", True),
)
#: (sent and received go last: a volunteer's contribution, ok/tokens, is what the table is read for)
_OPTIONAL = ("region", "seen", "role", "version", "recv", "sent")


def peer_rows(records: list[PeerRecord], now: float) -> list[dict[str, str]]:
    """One row of display strings per record (``status``'s table and the dashboard's)."""
    rows = []
    for r in records:
        x = r.extra
        rows.append(
            {
                "peer": r.peer_id[-8:],
                "role": r.role,
                "region": r.region,
                "step": str(r.step),
                "round": str(r.round),
                "tok/s": f"{r.throughput:,.0f}",
                "loss": "-" if r.loss != r.loss else f"{r.loss:.3f}",  # NaN: no loss reported yet
                "sent": human_bytes(r.bytes_sent),
                "recv": human_bytes(r.bytes_received),
                "ok/late/fail": "-"
                if "committed" not in x
                else f"{x.get('committed', 0)}/{x.get('late', 0)}/{x.get('failed', 0)}",
                # a volunteer's contribution: tokens of its own steps in the rounds it committed
                "tokens": "-" if "committed" not in x else short_count(r.contributed_tokens),
                "version": r.version,
                "seen": f"{max(now - r.time, 0):.0f}s" if r.time else "-",
            }
        )
    return rows


def peer_table(run_id: str, records: list[PeerRecord], width: int = 80) -> list[str]:
    """``status``'s table as plain lines no wider than ``width``: the optional columns go (region,
    then seen, role, version, recv, sent) until the rest fits; nothing is cut. A version shared by
    every peer is said once below the table instead of in a column, and differing ones below it when
    their column went."""
    import textwrap

    from peers.dht.node import dht_time

    rows = peer_rows(records, dht_time())
    cols = [c for c in _COLUMNS]
    footer = []
    versions = {r["version"] for r in rows}
    if len(versions) == 1:
        cols = [c for c in cols if c[0] != "version"]
        footer.append(f"every peer runs swarmtrain {versions.pop() or '?'}")
    widths = {h: max([len(h)] + [len(r[h]) for r in rows]) for h, _ in _COLUMNS}

    def total(cs: list[tuple[str, bool]]) -> int:
        return sum(widths[h] for h, _ in cs) + 2 * (len(cs) - 1)

    for drop in _OPTIONAL:
        if total(cols) <= width:
            break
        cols = [c for c in cols if c[0] != drop]

    if versions and not any(h == "version" for h, _ in cols):  # they differ and the column went
        by: dict[str, list[str]] = {}
        for r in rows:
            by.setdefault(r["version"] or "?", []).append(r["peer"])
        footer.append("versions differ:")
        footer += textwrap.wrap(
            "; ".join(f"{v} on {', '.join(ps)}" for v, ps in sorted(by.items())),
            width,
            initial_indent="  ",
            subsequent_indent="  ",
        )

    def line(values: dict[str, str]) -> str:
        cells = [values[h].rjust(widths[h]) if right else values[h].ljust(widths[h]) for h, right in cols]
        return "  ".join(cells).rstrip()

    out = [f"run {run_id!r}: {len(records)} live peer(s)"]
    out.append(line({h: h for h, _ in _COLUMNS}))
    out += [line(r) for r in rows]
    return out + footer


def register(app: typer.Typer) -> None:
    """Add the ``dht`` and ``status`` commands to ``app``."""
    app.command("dht")(dht)
    app.command("status")(status)
