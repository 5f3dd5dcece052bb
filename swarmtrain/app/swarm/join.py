"""``swarmtrain join --role server|trainer``: take a SWARM role in a real run.

The run-wide SWARM settings come from the run's ``[swarm]`` config section
(``swarmtrain.core.swarm_config.SwarmConfig``), so every server and trainer of a run agrees on the
stage cut, the codecs and the step size; the peer's own flags only say which role it takes:

* ``--role server [--stage auto|K]``: serve stage ``K`` (``auto``, the default: the bottleneck stage
  among the live servers' DHT records, ``peers.swarm.rebalance.bottleneck_stage``) with
  ``swarmtrain.app.swarm.server.run_server`` until SIGTERM or Ctrl-C, then average a last time with
  the stage's other servers and leave;
* ``--role trainer [--trainer-index T]``: feed trainer ``T``'s share of the micro-batches
  (``swarmtrain.app.swarm.roles.run_trainer``) and leave when they are done.

``--activation-codec`` sets the run's ``swarm.codec`` (the codec of hidden states and their
gradients between stages); a run's manifest refuses a value that differs from its own.

Each prints one status line when it starts and one with its counts when it leaves, and writes them
to ``--json`` if given. ``--role peer`` (the default) is the data-parallel / DiLoCo volunteer of
``swarmtrain.app.commands.join``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from swarmtrain.core.errors import ConfigError
from swarmtrain.core.jsonsafe import dumps

if TYPE_CHECKING:
    from swarmtrain.app.swarm.roles import ServerOutcome, TrainerOutcome
    from swarmtrain.core.config import Config
    from swarmtrain.core.swarm_config import SwarmConfig

__all__ = [
    "ROLES",
    "check_role_flags",
    "parse_stage",
    "settings_from_config",
    "run_swarm_join",
]

#: the roles ``join --role`` takes; ``peer`` is the data-parallel / DiLoCo volunteer
ROLES = ("peer", "server", "trainer")

# join's flags that configure the data-parallel peer, not a SWARM role (override key -> flag)
_PEER_ONLY = {
    "strategy.name": "--strategy",
    "compression.codec": "--compressor",
    "strategy.inner_steps": "--inner-steps",
    "train.steps": "--steps",
}


def check_role_flags(
    role: str, stage: str | None, trainer_index: int | None, *, activation_codec: str | None = None
) -> None:
    """The role flags alone, before any config is read.

    Raises:
        ConfigError: an unknown role, ``--stage`` without ``--role server``, ``--trainer-index``
            without ``--role trainer``, or ``--activation-codec`` without a SWARM role.
    """
    if role not in ROLES:
        raise ConfigError(f"--role {role!r}: choose one of {', '.join(ROLES)}")
    if stage is not None and role != "server":
        raise ConfigError(f"--stage applies to --role server only (this peer's role: {role})")
    if trainer_index is not None and role != "trainer":
        raise ConfigError(f"--trainer-index applies to --role trainer only (this peer's role: {role})")
    if activation_codec is not None and role == "peer":
        raise ConfigError(
            "--activation-codec applies to --role server or trainer only (the codec between SWARM "
            "stages; a data-parallel peer's codec is --compressor)"
        )


def parse_stage(text: str | None, stages: int) -> int | None:
    """``--stage``: ``None`` for ``auto`` (or no flag), else the stage number.

    Raises:
        ConfigError: not ``auto`` or an integer in ``[0, stages)``.
    """
    if text is None or text.strip().lower() == "auto":
        return None
    try:
        stage = int(text)
    except ValueError:
        raise ConfigError(f"--stage {text!r}: expected auto or a stage number") from None
    if not 0 <= stage < stages:
        raise ConfigError(f"--stage {stage} is outside [0, {stages}): the run's [swarm] stages is {stages}")
    return stage


def settings_from_config(cfg: Config) -> SwarmConfig:
    """The run's ``[swarm]`` section, checked against the model and the codec registry.

    Raises:
        ConfigError: more stages than the model has blocks, or an unknown codec (one line).
    """
    from compression import build_compressor
    from swarmtrain.app.models import resolve_spec
    from swarmtrain.app.models.stages import stage_blocks

    settings = cfg.swarm
    stage_blocks(resolve_spec(cfg.model).n_layer, settings.stages)
    for key in ("codec", "sync_codec"):
        name = getattr(settings, key)
        try:
            build_compressor(cfg.compression.model_copy(update={"codec": name}))
        except ConfigError as e:
            raise ConfigError(f"swarm.{key}: {e}") from None
    return settings


def _refuse_peer_flags(role: str, overrides: dict[str, Any]) -> None:
    for key, flag in _PEER_ONLY.items():
        if overrides.get(key) is not None:
            hint = " (the codec between stages is --activation-codec)" if flag == "--compressor" else ""
            raise ConfigError(
                f"{flag} does not apply to --role {role}: a SWARM run's settings are its config's "
                f"[swarm] section{hint}"
            )


def _write_json(path: Path | None, doc: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(doc, indent=2, default=str) + "\n")


def serve(
    cfg: Config, settings: SwarmConfig, stage_text: str | None, json_path: Path | None
) -> ServerOutcome:
    """Serve a stage until SIGTERM / Ctrl-C; print the status lines, write the JSON."""
    from peers import GracefulExit
    from swarmtrain.app.swarm.server import run_server

    stage = parse_stage(stage_text, settings.stages)
    auto = stage is None  # run_server takes the bottleneck stage of the live servers' records
    how = "auto: the bottleneck stage" if auto else "--stage"
    t0 = time.perf_counter()

    def ready(peer_id: str, serving: int) -> None:
        typer.echo(
            f"server: serving stage {serving} of {settings.stages} ({how}) as {peer_id}, "
            f"codec {settings.codec}; SIGTERM or Ctrl-C to leave",
            err=False,
        )

    def moved(src: int, dst: int, at: float, serving_at: float | None) -> None:
        what = (
            "left"
            if serving_at is None
            else f"caught up with stage {dst} {serving_at - at:.1f} s after it left"
        )
        typer.echo(f"server: rebalancing moved it from stage {src} to stage {dst}: {what}")

    def started(maddrs: list[str]) -> None:
        typer.echo("server: multiaddrs (others pass one as --initial-peers):")
        for m in maddrs:
            typer.echo(f"  {m}")

    with GracefulExit(message="leaving after the stage's last average") as stop:
        out = run_server(cfg, settings, stage, stop, on_ready=ready, on_move=moved, on_started=started)
    typer.echo(
        f"server left: stage {out.stage}, {out.served} requests served, {out.refused} refused, "
        f"{out.version} optimizer steps, {out.step_failures} step failures, {len(out.moves)} move(s), "
        f"last average with {out.final_group} server(s), digest {out.digest[:16]}, "
        f"{time.perf_counter() - t0:.0f} s"
    )
    doc = {k: v for k, v in dataclasses.asdict(out).items() if k != "state"}  # raw tensor bytes
    _write_json(json_path, {"role": "server", "stage_auto": auto, "stages": settings.stages, **doc})
    return out


def train(cfg: Config, settings: SwarmConfig, index: int, json_path: Path | None) -> TrainerOutcome:
    """Feed trainer ``index``'s micro-batches; print the status lines, write the JSON.

    Raises:
        ConfigError: ``index`` outside ``[0, swarm.trainers)``.
    """
    from swarmtrain.app.swarm.roles import run_trainer

    if not 0 <= index < settings.trainers:
        raise ConfigError(
            f"--trainer-index {index} is outside [0, {settings.trainers}): the run's [swarm] trainers "
            f"is {settings.trainers}"
        )
    typer.echo(
        f"trainer {index} of {settings.trainers}: {settings.microbatches} micro-batches of "
        f"{cfg.train.batch_size} through {settings.stages} stages, codec {settings.codec}"
    )
    out = run_trainer(cfg, settings, index)
    last = f"{out.losses[-1]:.4f}" if out.losses else "-"
    typer.echo(
        f"trainer {index} done as {out.peer_id}: {out.completed}/{settings.microbatches} micro-batches "
        f"completed, {out.lost} lost, {out.rerouted} rerouted, {out.fed_again} fed again, "
        f"{out.samples} samples in "
        f"{out.seconds:.1f} s, last loss {last}"
    )
    _write_json(json_path, {"role": "trainer", "stages": settings.stages, **dataclasses.asdict(out)})
    return out


def run_swarm_join(
    role: str,
    stage: str | None,
    trainer_index: int | None,
    load_config: Callable[[], Config],
    overrides: dict[str, Any],
    json_path: Path | None,
) -> None:
    """Load the run's config (``load_config``: join's, with ``overrides`` applied) and take ``role``
    (``server`` or ``trainer``) in it.

    Raises:
        ConfigError: one line: a bad role flag, a data-parallel flag, a bad ``[swarm]`` section or
            ``--stage``, or what ``load_config`` refuses.
    """
    check_role_flags(role, stage, trainer_index)
    if role not in ("server", "trainer"):
        raise ConfigError(f"--role {role} is not a SWARM role")
    _refuse_peer_flags(role, overrides)
    cfg = load_config()
    settings = settings_from_config(cfg)
    parse_stage(stage, settings.stages)  # a bad --stage is refused before any node starts
    cfg.train.progress = False
    if role == "server":
        serve(cfg, settings, stage, json_path)
    else:
        train(cfg, settings, trainer_index or 0, json_path)
