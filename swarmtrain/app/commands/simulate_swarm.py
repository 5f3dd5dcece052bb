"""``swarmtrain simulate --strategy swarm``: the flags of a SWARM run, its report and its JSON.

``--peers`` counts stage servers (spread round-robin over ``--stages``), ``--trainers`` the peers that
feed micro-batches, ``--steps`` the micro-batches each trainer feeds, ``--activation-codec`` the codec
of hidden states and their gradients between stages (default ``none``: fp32). ``--stages``,
``--trainers`` and ``--activation-codec`` set the config's ``[swarm]`` section
(``swarmtrain.core.swarm_config.SwarmConfig``), which gives the run's other SWARM settings; the flags
of the data-parallel strategies (``--compressor`` among them: the averaging codec) are refused. The
run itself is ``swarmtrain.simulation.swarm.run_swarm_simulation``. ``--chaos SPEC`` kills, preempts
and restarts servers (``swarmtrain.simulation.swarm_chaos``) after a clean run of the same
configuration, and the JSON gains the fields of every strategy's chaos run
(``swarmtrain.app.commands.chaos_report``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import typer

from swarmtrain.core.errors import ConfigError
from swarmtrain.core.jsonsafe import dumps

if TYPE_CHECKING:
    from swarmtrain.core.config import Config
    from swarmtrain.core.swarm_config import SwarmConfig
    from swarmtrain.simulation.swarm_result import SwarmResult

__all__ = ["run_swarm_simulate", "swarm_settings", "SwarmFlags", "NOT_SWARM"]

#: the config sections of the data-parallel runs: a flag that sets one means nothing to SWARM
NOT_SWARM = ("strategy", "compression", "peers", "simulation")


class SwarmFlags(Protocol):
    """The flags of ``simulate`` this module reads (``simulate.SimulateOptions`` has them all)."""

    @property
    def peers(self) -> int: ...
    @property
    def strategy(self) -> str | None: ...
    @property
    def kill_servers(self) -> int: ...
    @property
    def byzantine_servers(self) -> int: ...
    @property
    def baseline(self) -> bool: ...
    @property
    def timeout(self) -> float: ...
    @property
    def json_path(self) -> Path | None: ...
    @property
    def chaos(self) -> str | None: ...
    @property
    def intruders(self) -> int: ...
    def given(self, sections: tuple[str, ...], but: tuple[str, ...] = ()) -> list[str]: ...


def _refuse_other_flags(opts: SwarmFlags) -> None:
    """Flags of the data-parallel strategies mean nothing to SWARM: one line naming the first."""
    if opts.strategy != "swarm":
        raise ConfigError("--stages and the other SWARM flags need --strategy swarm")
    others = opts.given(NOT_SWARM, but=("strategy.name",)) + (["--intruders"] if opts.intruders else [])
    if others:
        flag = others[0]
        hint = " (the codec between stages is --activation-codec)" if flag == "--compressor" else ""
        raise ConfigError(f"{flag} does not apply to --strategy swarm{hint}")
    if opts.chaos is not None and opts.kill_servers:
        raise ConfigError("--kill-servers and --chaos: give one (--chaos kill=RATE kills servers too)")


def swarm_settings(opts: SwarmFlags, load_config: Callable[[], Config]) -> tuple[Config, SwarmConfig]:
    """The run's config and its ``[swarm]`` settings, checked before any process starts: each
    trainer feeds ``--steps`` micro-batches, and under ``--chaos`` no server moves.
    ``load_config``: the run's config without ``--strategy`` (``swarm`` is no data-parallel strategy).

    Raises:
        ConfigError: one line naming the problem.
    """
    from swarmtrain.app.swarm.join import settings_from_config
    from swarmtrain.simulation.swarm import spread_servers

    _refuse_other_flags(opts)
    cfg = load_config()
    settings = settings_from_config(cfg)  # stages against the model, codecs against the registry
    # under --chaos no server moves: a move that coincides with the preemption of its stage's other
    # server empties the stage (rebalancing has no guard against that)
    settings.microbatches = cfg.train.steps
    settings.rebalance = settings.rebalance and opts.chaos is None
    spread_servers(opts.peers, settings.stages)
    if opts.kill_servers > opts.peers - settings.stages:
        raise ConfigError(
            f"--kill-servers {opts.kill_servers}: {opts.peers} servers over {settings.stages} stages "
            f"leave at most {opts.peers - settings.stages} that can die without emptying a stage"
        )
    if opts.byzantine_servers > opts.peers - settings.stages:
        raise ConfigError(
            f"--byzantine-servers {opts.byzantine_servers}: at most "
            f"{opts.peers - settings.stages}, to keep an honest server per stage"
        )
    return cfg, settings


def run_swarm_simulate(opts: SwarmFlags, load_config: Callable[[], Config]) -> None:
    """Run SWARM as ``opts`` asks, print the outcome, write the JSON.

    Raises:
        typer.Exit: code 1 when a stage's replicas differ at the end or a micro-batch was lost.
    """
    from rich.console import Console

    from swarmtrain.app.commands.chaos_report import chaos_fields, chaos_line
    from swarmtrain.simulation.chaos import parse_chaos
    from swarmtrain.simulation.swarm import run_swarm_simulation

    cfg, settings = swarm_settings(opts, load_config)
    chaos = parse_chaos(opts.chaos) if opts.chaos is not None else None
    console = Console(stderr=True)
    faults = f"chaos: {chaos.describe()}" if chaos else f"{opts.kill_servers} server(s) killed mid-run"
    if opts.byzantine_servers:
        faults += f", {opts.byzantine_servers} lying server(s)"
    checks = f"{settings.verify_rate:g} of replies checked" if settings.verify_rate else "no replica check"
    console.print(
        f"swarmtrain simulate: SWARM, {opts.peers} servers over {settings.stages} stages, "
        f"{settings.trainers} trainer(s) x {settings.microbatches} micro-batches of {cfg.train.batch_size}, "
        f"codec {settings.codec}, {checks}, {faults}"
    )
    clean = None
    if chaos is not None:
        console.print("the clean run (no chaos) first")
        clean = run_swarm_simulation(cfg, settings, opts.peers, timeout=opts.timeout)
        console.print(f"clean: val loss {clean.final_val_loss:.4f}; now the run with chaos")
    res = run_swarm_simulation(
        cfg,
        settings,
        opts.peers,
        kill_servers=opts.kill_servers,
        baseline=opts.baseline,
        timeout=opts.timeout,
        chaos=chaos,
        byzantine_servers=opts.byzantine_servers,
    )
    out = res.summary()
    if chaos is not None and clean is not None:
        out.update(chaos_fields(res, clean, chaos))
        typer.echo(chaos_line(out))
        late = ", ".join(res.out_of_step) or "none"
        typer.echo(f"  restarts caught up: {res.restarts_caught_up}/{res.restarts}; out of step: {late}")
    console.print(_outcome_line(res))
    if opts.json_path is not None:
        opts.json_path.write_text(dumps(out, indent=2) + "\n")
        console.print(f"wrote {opts.json_path}")
    if not res.params_identical or res.lost_microbatches:
        raise typer.Exit(1)


def _outcome_line(res: SwarmResult) -> str:
    """The run's outcome, as the command prints it after the run."""
    base = f", baseline {res.baseline_val_loss:.4f}" if res.baseline_val_loss is not None else ""
    return (
        f"val loss {res.final_val_loss:.4f}{base}; {res.samples} samples at "
        f"{res.throughput_samples_per_s:.1f}/s; rerouted {res.rerouted}, lost {res.lost_microbatches}, "
        f"fed again {res.fed_again}, "
        f"killed {res.killed or 'none'}, rebalancing moves {res.rebalance_moves}; "
        f"replicas identical: {'yes' if res.params_identical else 'NO'}; replica checks "
        f"{res.swarm_checked}, mismatches {res.swarm_mismatches}, excluded {res.excluded_servers}"
        + (f" ({', '.join(res.excluded)})" if res.excluded else "")
        + f"; memory {res.rss_per_peer_mib:,.0f} MiB per peer, {res.peak_rss_total_mib:,.0f} MiB in all"
    )
