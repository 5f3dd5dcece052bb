"""``swarmtrain run init``, ``swarmtrain token issue``, ``swarmtrain identity``: a run's root of trust.

The run's creator makes the run key once (``run init``): it signs the run manifest (settings,
admission policy, software version, initial-state hash; ``peers.trust.manifest``) that the bootstrap node
serves, so a volunteer needs only the bootstrap's address. The config it writes is for the run's
own peers (it holds the run's public key, never the secret). The creator issues a join token per
volunteer peer ID (``token issue``); a volunteer learns its peer ID with ``identity`` and passes the
token to ``swarmtrain join --token``. ``token revoke`` withdraws a peer's admission before its token
expires (a revocation signed by the run key, stored in the run's DHT; ``peers.trust.revocation``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from swarmtrain.app.commands.flags import argument, command, config_overrides, flag
from swarmtrain.app.commands.peers import given_maddrs

if TYPE_CHECKING:  # imported for real inside the functions, so --help stays fast
    from peers.trust.admission import RunKey

__all__ = [
    "register",
    "run_init",
    "token_issue",
    "token_revoke",
    "identity",
    "RunInitOptions",
    "TokenIssueOptions",
    "TokenRevokeOptions",
]

_CONFIG = "swarmtrain.toml"
_HOUR = 3600.0


@dataclass(frozen=True)
class RunInitOptions:
    """What ``swarmtrain run init`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``). ``--reducer`` and ``--tolerate`` not given: the admission
    policy's defaults (:func:`_run_options`)."""

    directory: Path = argument(..., help="Folder for the run key and the shared config (created).")
    run_id: str = flag("swarmtrain", "--run-id", key="peers.run_id", help="The run's ID.")
    admission: str = flag(
        "token", "--admission", key="peers.admission", help="Who may join: token, allowlist or open."
    )
    hours: float = flag(24 * 30, "--hours", min=0.01, help="Validity of the bootstrap's token.")
    strategy: str = flag("diloco", "--strategy", "-s", key="strategy.name", help="The run's strategy.")
    inner_steps: int | None = flag(
        30, "--inner-steps", "-H", key="strategy.inner_steps", min=1, help="DiLoCo H."
    )
    compressor: str = flag("int8", "--compressor", key="compression.codec", help="The run's codec.")
    reducer: str | None = flag(
        None,
        "--reducer",
        key="peers.reducer",
        help="Aggregation rule (default: mean; centered_clip under --admission open).",
    )
    tolerate: int | None = flag(
        None,
        "--tolerate",
        key="peers.byzantine_f",
        min=0,
        help="Byzantine peers the reducer tolerates (default 1 when open).",
    )


@command(RunInitOptions)
def run_init(opts: RunInitOptions) -> None:
    """Create a run: its key (secret), its signed manifest, a shared config, and the bootstrap node's
    identity and token. Volunteers then need only the bootstrap's address (and a token)."""
    from swarmtrain.core.config import load_config

    directory = opts.directory
    cfg = load_config(None, _run_options(opts), env={})  # checks every value before anything is written
    key, boot_id, cfg_path, manifest_path = _write_run(directory, cfg)
    typer.echo(f"run key (keep it secret): {directory / 'run.key'}")
    typer.echo(f"signed run manifest (served by the bootstrap): {manifest_path}")
    typer.echo(f"config of the run's own peers: {cfg_path}")
    boot = f"swarmtrain dht --manifest {manifest_path} --identity {directory / 'bootstrap.key'}"
    if opts.admission == "token":
        from peers.trust.admission import encode_token_text

        tok = encode_token_text(key.issue(opts.run_id, boot_id, time.time() + opts.hours * _HOUR))
        boot += f" --token {tok}"
    typer.echo(f"start the bootstrap node:\n  {boot}")
    typer.echo("volunteers join with its address: swarmtrain join --initial-peers ADDR")
    if opts.admission == "token":
        typer.echo(
            "admit a volunteer (they print their peer ID with `swarmtrain identity FILE`; they pass\n"
            "the token and that file: join --initial-peers ADDR --identity FILE --token TOKEN):\n"
            f"  swarmtrain token issue --run-key {directory / 'run.key'} --config {cfg_path} PEER_ID"
        )


def _run_options(opts: RunInitOptions) -> dict[str, object]:
    """``run init``'s flags as config overrides, with the admission policy's reducer defaults (an
    open run tolerates one Byzantine peer with ``centered_clip``).

    Raises:
        ConfigError: an unknown admission policy or a malformed run ID.
    """
    from peers.dht.node import RUN_ID_PATTERN
    from peers.trust.admission import POLICIES
    from swarmtrain.core.errors import ConfigError

    admission, run_id = opts.admission, opts.run_id
    if admission not in POLICIES:
        raise ConfigError(f"--admission must be one of {', '.join(POLICIES)}, not {admission!r}")
    if not RUN_ID_PATTERN.match(run_id):
        raise ConfigError(f"--run-id {run_id!r}: use 1-64 letters, digits, '_', '.', '-'")
    options: dict[str, object] = config_overrides(opts)
    if opts.reducer is None:
        options["peers.reducer"] = "centered_clip" if admission == "open" else "mean"
    if opts.tolerate is None:
        options["peers.byzantine_f"] = 1 if admission == "open" else 0
    if opts.strategy not in ("diloco", "streaming_diloco"):
        del options["strategy.inner_steps"]
    return options


def _write_run(directory: Path, cfg: Any) -> tuple[RunKey, str, Path, Path]:
    """Write the run into ``directory``: its key, the bootstrap's identity, the signed manifest and the
    config of the run's own peers (``cfg`` with the run's public key). Returns the run key, the
    bootstrap's peer ID, the config's path and the manifest's.

    Raises:
        ConfigError: the folder already holds a run, or cannot be created.
    """
    from peers.keys.identity import ensure_identity
    from peers.trust.admission import RunKey
    from swarmtrain.app.peer.run_manifest import make_manifest
    from swarmtrain.core.errors import ConfigError

    cfg_path = directory / _CONFIG
    if cfg_path.exists():
        raise ConfigError(f"{cfg_path} exists; run init never overwrites a run")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create {directory}: {e.strerror}") from None
    key = RunKey.generate(directory / "run.key")
    boot_id = ensure_identity(directory / "bootstrap.key")
    cfg.peers.run_public_key = key.public_hex
    if cfg.peers.admission == "allowlist":
        cfg.peers.allowlist = [boot_id]
    manifest_path = (directory / "run.manifest").resolve()
    manifest_path.write_bytes(make_manifest(cfg, key))
    cfg_path.write_text(_config_text(cfg, manifest_path))
    return key, boot_id, cfg_path, manifest_path


def _config_text(cfg: Any, manifest_path: Path) -> str:
    """The config ``run init`` writes for the run's own peers: the settings it was given."""
    p, st = cfg.peers, cfg.strategy
    lines = ["[peers]", f'run_id = "{p.run_id}"', f'admission = "{p.admission}"']
    lines += [f'run_public_key = "{p.run_public_key}"', f'manifest = "{manifest_path}"']
    if p.admission == "allowlist":
        lines.append(f"allowlist = {json.dumps(list(p.allowlist))}")
    lines += [
        f'reducer = "{p.reducer}"',
        f"byzantine_f = {p.byzantine_f}",
        "",
        "[strategy]",
        f'name = "{st.name}"',
    ]
    if st.name in ("diloco", "streaming_diloco"):
        lines.append(f"inner_steps = {st.inner_steps}")
    lines += ["", "[compression]", f'codec = "{cfg.compression.codec}"']
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TokenIssueOptions:
    """What ``swarmtrain token issue`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``; ``None``: not given)."""

    peer_id: str = argument(..., help="The volunteer's peer ID (`swarmtrain identity FILE`).")
    run_key: Path = flag(..., "--run-key", help="The run key written by `swarmtrain run init`.")
    config: Path | None = flag(None, "--config", "-c", help="The run's config (for its run ID).")
    run_id: str | None = flag(
        None, "--run-id", key="peers.run_id", help="The run ID (default: the config's)."
    )
    hours: float = flag(24 * 30, "--hours", min=0.01, help="Hours the token stays valid.")


@command(TokenIssueOptions)
def token_issue(opts: TokenIssueOptions) -> None:
    """Print a join token admitting PEER_ID to the run (pass it to `swarmtrain join --token`)."""
    from peers.trust.admission import RunKey, encode_token_text
    from swarmtrain.core.config import load_config
    from swarmtrain.core.errors import ConfigError

    cfg = load_config(opts.config, config_overrides(opts))
    run_key, peer_id = opts.run_key, opts.peer_id
    key = RunKey.load(run_key)
    if cfg.peers.run_public_key and cfg.peers.run_public_key != key.public_hex:
        raise ConfigError(f"{run_key} is not the key of this run (its public key differs from the config's)")
    if not peer_id.isalnum() or len(peer_id) > 128:
        raise ConfigError(f"{peer_id!r} is not a peer ID")
    token = key.issue(cfg.peers.run_id, peer_id, time.time() + opts.hours * _HOUR)
    typer.echo(encode_token_text(token))


@dataclass(frozen=True)
class TokenRevokeOptions:
    """What ``swarmtrain token revoke`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``; ``None``: not given)."""

    peer_id: str = argument(..., help="The peer ID whose join tokens stop admitting it.")
    run_key: Path = flag(..., "--run-key", help="The run key written by `swarmtrain run init`.")
    config: Path | None = flag(None, "--config", "-c", help="The run's config (run ID, identity, token).")
    run_id: str | None = flag(
        None, "--run-id", key="peers.run_id", help="The run ID (default: the config's)."
    )
    initial_peers: list[str] | None = flag(
        None,
        "--initial-peers",
        key="peers.initial_peers",
        convert=given_maddrs,
        help="A peer of the run: store the revocation in its DHT (with the config's identity and token).",
    )
    hours: float = flag(
        24 * 31, "--hours", min=0.01, help="Hours the revocation lasts (at least the token's lifetime)."
    )


@command(TokenRevokeOptions)
def token_revoke(opts: TokenRevokeOptions) -> None:
    """Revoke PEER_ID's admission: sign a revocation with the run key and, with --initial-peers, store
    it in the run's DHT, where every running peer reads it within a minute."""
    from peers.trust.admission import RunKey, encode_token_text
    from peers.trust.revocation import sign_revocation
    from swarmtrain.core.config import load_config
    from swarmtrain.core.errors import ConfigError, SwarmError

    cfg = load_config(opts.config, config_overrides(opts))
    key = RunKey.load(opts.run_key)
    if cfg.peers.run_public_key and cfg.peers.run_public_key != key.public_hex:
        raise ConfigError(
            f"{opts.run_key} is not the key of this run (its public key differs from the config's)"
        )
    if not opts.peer_id.isalnum() or len(opts.peer_id) > 128:
        raise ConfigError(f"{opts.peer_id!r} is not a peer ID")
    until = time.time() + opts.hours * _HOUR
    blob = sign_revocation(key, cfg.peers.run_id, opts.peer_id, until)
    if not cfg.peers.initial_peers:
        typer.echo(encode_token_text(blob))
        return
    from peers.dht.node import PeerNode
    from peers.dht.revocations import store_revocations

    node = PeerNode(cfg.peers, role="monitor", client_mode=True, publish_record=False)
    try:
        if not store_revocations(node, [blob], until):
            raise SwarmError("no DHT node stored the revocation; try again")
    finally:
        node.shutdown()
    typer.echo(f"revoked {opts.peer_id} in run {cfg.peers.run_id!r} (peers honour it within a minute)")


def identity(
    path: Path | None = typer.Argument(
        None, help="Private key file; created if missing (default: this machine's, the one join uses)."
    ),
) -> None:
    """Print the peer ID of an identity file (creating the file if it does not exist); without FILE,
    of this machine's default identity, which `join` uses when given no --identity."""
    from peers.keys.identity import default_identity_path, ensure_identity

    typer.echo(ensure_identity(path if path is not None else default_identity_path()))


def register(app: typer.Typer) -> None:
    """Add ``run init``, ``token issue`` and ``identity`` to ``app``."""
    run_app = typer.Typer(help="Create a run's root of trust.", no_args_is_help=True)
    run_app.command("init")(run_init)
    token_app = typer.Typer(help="Join tokens for the run's volunteers.", no_args_is_help=True)
    token_app.command("issue")(token_issue)
    token_app.command("revoke")(token_revoke)
    app.add_typer(run_app, name="run")
    app.add_typer(token_app, name="token")
    app.command("identity")(identity)
