"""``swarmtrain join``: contribute this machine to a run with one command."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import typer

from swarmtrain.app.commands.flags import command, config_overrides, flag
from swarmtrain.app.commands.peers import given_maddrs
from swarmtrain.core.jsonsafe import dumps

__all__ = ["register", "join", "run_join", "end_line", "JoinOptions"]


@dataclass(frozen=True)
class JoinOptions:
    """What ``swarmtrain join`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``; ``None``: not given)."""

    initial_peers: list[str] | None = flag(
        None,
        "--initial-peers",
        key="peers.initial_peers",
        convert=given_maddrs,
        help="Multiaddrs of any live peer (e.g. printed by `swarmtrain dht`).",
    )
    config: Path | None = flag(None, "--config", "-c", help="TOML config file of the run.")
    run_id: str | None = flag(
        None, "--run-id", key="peers.run_id", help="Run to join (default: the config's)."
    )
    identity: str | None = flag(
        None,
        "--identity",
        key="peers.identity_path",
        help="Private key file (created if missing): keeps the peer ID on restarts; default under token "
        "or allowlist: this machine's (`swarmtrain identity` prints its peer ID).",
    )
    host_maddrs: list[str] | None = flag(
        None, "--host-maddrs", key="peers.host_maddrs", convert=given_maddrs, help="Multiaddrs to listen on."
    )
    announce_maddrs: list[str] | None = flag(
        None,
        "--announce-maddrs",
        key="peers.announce_maddrs",
        convert=given_maddrs,
        help="Public multiaddrs to announce.",
    )
    token: str | None = flag(
        None,
        "--token",
        key="peers.token",
        help="Join token from the run's creator (runs with admission 'token').",
    )
    region: str | None = flag(
        None, "--region", key="peers.region", help="A label shown in `swarmtrain status`."
    )
    strategy: str | None = flag(
        None, "--strategy", "-s", key="strategy.name", help="Strategy (must match the run)."
    )
    compressor: str | None = flag(
        None, "--compressor", key="compression.codec", help="Codec (must match the run)."
    )
    inner_steps: int | None = flag(
        None, "--inner-steps", "-H", key="strategy.inner_steps", min=1, help="DiLoCo H."
    )
    steps: int | None = flag(None, "--steps", key="train.steps", min=1, help="Stop after this many steps.")
    device: str | None = flag(None, "--device", key="train.device", help="auto, cpu, cuda, cuda:1...")
    data: list[str] | None = flag(
        None,
        "--data",
        key="data.paths",
        help="Text file/folder or .bin token file (repeatable); default: the config's.",
    )
    json_path: Path | None = flag(None, "--json", help="Write a summary of the run here.")
    log_every: float = flag(
        10.0,
        "--log-every",
        min=1.0,
        help="Seconds between status lines when the output is not a terminal.",
    )
    role: str = flag(
        "peer",
        "--role",
        help="peer (data-parallel / DiLoCo volunteer), or a SWARM role: server, trainer.",
    )
    stage: str | None = flag(
        None, "--stage", help="--role server: auto (the bottleneck stage, default) or a stage number."
    )
    trainer_index: int | None = flag(
        None,
        "--trainer-index",
        min=0,
        help="--role trainer: which share of the micro-batches (default 0).",
    )
    activation_codec: str | None = flag(
        None,
        "--activation-codec",
        key="swarm.codec",
        help="--role server or trainer: codec between stages (must match the run's [swarm] codec).",
    )


@command(JoinOptions)
def join(opts: JoinOptions) -> None:
    """Join a training run: download its current state from live peers, train, and sync.

    Shows a live line (step, round and its peers, loss, tokens/s, bytes up/down, time to the next
    sync); piped, a timestamped line every --log-every seconds. Ctrl-C or SIGTERM finishes the
    current step and leaves cleanly; a second one aborts.

    In a SWARM run (the config's [swarm] section sets stages, codecs, trainers, micro-batches),
    --role server serves one stage (--stage auto: the bottleneck) until Ctrl-C or SIGTERM, and
    --role trainer feeds its share of the micro-batches through the stages and leaves when done.
    """
    from swarmtrain.app.swarm.join import check_role_flags, run_swarm_join

    overrides = config_overrides(opts)
    by_manifest = opts.config is None and opts.run_id is None
    check_role_flags(opts.role, opts.stage, opts.trainer_index, activation_codec=opts.activation_codec)
    if opts.role != "peer":
        load = partial(load_join_config, opts.config, overrides, by_manifest=by_manifest)
        run_swarm_join(opts.role, opts.stage, opts.trainer_index, load, overrides, opts.json_path)
        return
    run_join(opts.config, overrides, opts.json_path, log_every=opts.log_every, by_manifest=by_manifest)


def load_join_config(config: Path | None, overrides: dict[str, Any], *, by_manifest: bool) -> Any:
    """The volunteer's config: with ``by_manifest`` (no --config, no --run-id), from the run manifest
    its initial peer serves; else from the config (and the manifest file it names, if any).

    Raises:
        ConfigError: one line: no manifest served (or no peer at the address), a setting or release
            that differs from the manifest's, an open run without a robust reducer, a token the
            manifest's key did not sign (whatever policy it states), or a model beyond this machine's
            memory (before anything is allocated).
    """
    from peers.trust.admission import check_own_admission
    from peers.trust.manifest import read_manifest_file
    from swarmtrain.app.peer.run_manifest import (
        check_model_fits,
        check_open_policy,
        config_from_manifest,
        keep_manifest,
    )
    from swarmtrain.app.peer.token_check import check_token_signer
    from swarmtrain.core.config import load_config

    if by_manifest:
        own = load_config(None, overrides)  # this peer's own flags and environment: their errors come first
        manifest, document = _fetch_manifest(list(overrides.get("peers.initial_peers") or []))
        if own.peers.token:  # whatever policy the manifest states: an impostor's may say "open"
            check_token_signer(own.peers.token, manifest.run_id, manifest.run_public_key)
        overrides = {**overrides, "peers.manifest": keep_manifest(document)}
        cfg = config_from_manifest(manifest, None, overrides)  # refuses a model beyond this machine
    else:
        cfg = load_config(config, overrides)
        if cfg.peers.manifest:
            manifest = read_manifest_file(cfg.peers.manifest)
            if cfg.peers.token:
                check_token_signer(cfg.peers.token, manifest.run_id, manifest.run_public_key)
            cfg = config_from_manifest(manifest, config, overrides)
        else:
            check_model_fits(cfg, cfg.peers.run_id)
    check_open_policy(cfg)
    if cfg.peers.admission != "open" and not cfg.peers.identity_path:
        from peers.keys.identity import default_identity_path

        cfg.peers.identity_path = str(default_identity_path())  # what `swarmtrain identity` prints
    check_own_admission(cfg.peers)  # a peer the run keeps out learns it before any work
    return cfg


def _fetch_manifest(initial_peers: list[str]) -> tuple[Any, bytes]:
    """The manifest the initial peers serve, and its document.

    Raises:
        ConfigError: one line naming the cause: nothing listens at the address, the peer ID does not
            answer there, a timeout, or a peer that serves no manifest (then: pass --config).
    """
    from peers.dht.manifest_fetch import NoManifest, fetch_manifest
    from swarmtrain.core.errors import ConfigError, SwarmError

    try:
        manifest, document, _ = fetch_manifest(initial_peers)
    except NoManifest as e:
        raise ConfigError(f"{e}; for a run without a manifest pass its --config or --run-id") from None
    except SwarmError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
    return manifest, document


def run_join(
    config: Path | None,
    overrides: dict[str, Any],
    json_path: Path | None,
    *,
    log_every: float = 10.0,
    by_manifest: bool = False,
) -> None:
    """Load the run's config, join it as a volunteer with a live status line, and print a summary.

    ``json_path`` is written on every exit, with ``exit_code`` and ``reason``: a refusal (2), a
    failure (1), a run that committed no round (1, unless stopped by a signal), or done (0).

    Raises:
        SwarmError: the volunteer committed no round (its steps reached no other peer).
    """
    from swarmtrain.core.errors import SwarmError

    def grace_over(result: Any) -> None:  # the preemption watchdog's exit skips everything below
        reason = "the preemption grace ran out while leaving (peers.preempt_grace)"
        _write_result(json_path, result, 1, reason)

    try:
        result = _volunteer(config, overrides, grace_over, log_every=log_every, by_manifest=by_manifest)
    except BaseException as e:
        _write_json(json_path, {"exit_code": _exit_code(e), "reason": _reason(e)})
        raise
    how = "stopped by signal" if result.stopped_by_signal else "done"
    typer.echo(end_line(how, result))
    code, reason = 0, how
    if result.committed_rounds == 0 and not result.stopped_by_signal:
        code = 1
        reason = (
            f"no round committed in {result.steps} steps: this volunteer's work reached no other peer "
            "(too few peers for a round, or every round failed)"
        )
    _write_result(json_path, result, code, reason)
    if code:
        raise SwarmError(reason)


def end_line(how: str, result: Any) -> str:
    """``join``'s last words, two lines of at most 80 columns: what the volunteer contributed (its
    tokens in the rounds it committed, and those rounds), then its val loss and traffic."""
    from swarmtrain.app.units import human_bytes, short_count

    return (
        f"{how}: {result.steps} steps, {result.committed_rounds} rounds committed, "
        f"{short_count(result.contributed_tokens)} tokens contributed\n"
        f"val loss {_loss_text(result.final_val_loss)}, "
        f"sent {human_bytes(result.bytes_sent)}, received {human_bytes(result.bytes_received)}"
    )


def _volunteer(
    config: Path | None,
    overrides: dict[str, Any],
    grace_over: Callable[[Any], None],
    *,
    log_every: float,
    by_manifest: bool,
) -> Any:
    """The config, the budget and data lines, then the volunteer's run under its live line."""
    from swarmtrain.app.data import describe_data
    from swarmtrain.app.peer.volunteer import run_volunteer
    from swarmtrain.core.errors import ConfigError

    cfg = load_join_config(config, overrides, by_manifest=by_manifest)
    if cfg.strategy.name == "local":
        raise ConfigError("strategy 'local' trains alone; choose a networked one, e.g. --strategy diloco")
    if cfg.peers.min_peers < 2:
        cfg.peers.min_peers = 2  # a round with only ourselves is no sync
    cfg.train.progress = False
    from swarmtrain.app.peer.live import LiveLine
    from swarmtrain.app.train.memory_budget import budget_report
    from swarmtrain.app.train.trainer import resolve_device

    print(budget_report(cfg, resolve_device(cfg.train.device)), file=sys.stderr, flush=True)
    print(describe_data(cfg.data), file=sys.stderr, flush=True)
    with LiveLine(every_s=log_every) as live:
        return run_volunteer(cfg, on_status=live.update, on_grace_over=grace_over)


def _exit_code(e: BaseException) -> int:
    """The exit status the CLI gives ``e`` (``swarmtrain.app.cli``)."""
    from swarmtrain.core.errors import ConfigError

    if isinstance(e, typer.Exit):
        return int(e.exit_code)
    if isinstance(e, KeyboardInterrupt):
        return 130
    return 2 if isinstance(e, ConfigError) else 1  # SwarmError and anything unexpected: 1


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def _write_json(json_path: Path | None, summary: dict[str, Any]) -> None:
    if json_path is None:
        return
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(dumps(summary, indent=2, default=str) + "\n")


def _write_result(json_path: Path | None, result: Any, code: int, reason: str) -> None:
    """The run's summary with how it ended: what every exit with a result writes to ``--json``."""
    _write_json(json_path, {**asdict(result), "exit_code": code, "reason": reason})


def _loss_text(loss: float | None) -> str:
    """A final loss for the summary line: ``-`` (not measured: stopped early) instead of ``nan``."""
    return "- (not measured)" if loss is None or loss != loss else f"{loss:.4f}"


def register(app: typer.Typer) -> None:
    """Add ``join`` to the CLI."""
    app.command("join")(join)
