"""``swarmtrain simulate``: a bootstrap node and N real peers on 127.0.0.1, optionally vs a baseline.

The simulation package is imported lazily, inside the command: nothing else in the app reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from swarmtrain.app.commands.flags import command, config_overrides, flag, given_flags
from swarmtrain.app.commands.simulate_checks import validate_names
from swarmtrain.core.jsonsafe import dumps

if TYPE_CHECKING:
    from swarmtrain.app.peer.loop import PeerStatus
    from swarmtrain.core.config import Config
    from swarmtrain.simulation.results import SimulationResult

from swarmtrain.app.local_run import SIMULATE_DEFAULTS, crowded_defaults

__all__ = ["register", "simulate", "run_simulate", "SimulateOptions", "ATTACKED_STEPS"]

#: steps per peer by default with --intruders or --colluders (below a config's and --steps)
ATTACKED_STEPS = 120


def _table(rows: list[Any]) -> Any:
    """The runs side by side, one column each and one row per measure: at most three runs, so it
    reads at 80 columns, and a long run name wraps in its header instead of cutting a number."""
    from rich.table import Table

    from swarmtrain.app.units import human_bytes

    t = Table(title="swarmtrain simulate")
    t.add_column("", no_wrap=True)
    for label, _ in rows:
        t.add_column(label, justify="right", overflow="fold")
    measures: list[tuple[str, Any]] = [
        ("peers", lambda r: str(r.peers)),
        ("tokens", lambda r: f"{r.tokens:,}"),
        ("final val loss", lambda r: f"{r.final_val_loss:.4f}"),
        ("sent / peer", lambda r: human_bytes(r.bytes_sent_per_peer)),
        ("bytes / token", lambda r: f"{r.bytes_per_token:.3f}"),
        ("params identical", lambda r: "yes" if r.params_identical else "NO"),
        ("memory / peer", lambda r: f"{r.rss_per_peer_mib:,.0f} MiB"),  # PSS of its process tree
        ("wall", lambda r: f"{r.wall_s:,.0f} s"),
    ]
    for name, cell in measures:
        t.add_row(name, *(cell(r) for _, r in rows))
    return t


@dataclass(frozen=True)
class SimulateOptions:
    """What ``swarmtrain simulate`` was asked for: each field is one flag, declared once
    (``swarmtrain.app.commands.flags``; ``None``: not given). A flag with a config key sets it in the
    run's config; the others are the command's own."""

    peers: int = flag(4, "--peers", "-n", min=1, max=64, help="Training peers to start.")
    strategy: str | None = flag(
        None, "--strategy", "-s", key="strategy.name", help="Strategy [default: diloco]."
    )
    compressor: str | None = flag(
        None, "--compressor", key="compression.codec", help="Codec name [default: int8]."
    )
    steps: int | None = flag(None, "--steps", key="train.steps", min=1, help="Local steps per peer.")
    inner_steps: int | None = flag(
        None, "--inner-steps", "-H", key="strategy.inner_steps", min=1, help="DiLoCo H [30]."
    )
    fragments: int | None = flag(
        None, "--fragments", key="strategy.fragments", min=1, help="StreamingDiLoCo: F."
    )
    overlap: int | None = flag(
        None, "--overlap", key="strategy.overlap", min=0, help="StreamingDiLoCo: tau steps."
    )
    mixing: float | None = flag(
        None, "--mixing", key="strategy.mixing", min=0.0, max=1.0, help="Streaming: alpha."
    )
    error_feedback: str | None = flag(
        None, "--error-feedback", key="compression.error_feedback", help="none, ef or ef21."
    )
    reducer: str | None = flag(
        None, "--reducer", key="peers.reducer", help="Aggregation rule (default mean)."
    )
    byzantine: int | None = flag(
        None,
        "--byzantine",
        key="simulation.attackers",
        min=0,
        help="How many peers attack (ranks 0..K-1; see --attack).",
    )
    attack: str | None = flag(
        None,
        "--attack",
        key="simulation.attack",
        help="Attack the Byzantine peers run: sign_flip, random_direction, gaussian_noise, label_flip, "
        "alie, ipm, stale, malicious_owner.",
    )
    tolerate: int | None = flag(
        None, "--tolerate", key="peers.byzantine_f", min=0, help="f the reducer tolerates."
    )
    malicious_owners: int | None = flag(
        None,
        "--malicious-owners",
        key="simulation.malicious_owners",
        min=0,
        help="Ranks after the attackers that return wrong aggregates.",
    )
    owner_check: bool | None = flag(
        None,
        "--owner-check/--no-owner-check",
        key="peers.owner_check",
        help="Replicated-owner check, suspicion and bans.",
    )
    preset: str | None = flag(None, "--preset", key="model.preset", help="Model preset (default tiny).")
    batch_size: int | None = flag(None, "--batch-size", key="train.batch_size", min=1)
    lr: float | None = flag(None, "--lr", key="train.lr", help="Inner learning rate.")
    seed: int | None = flag(None, "--seed", key="train.seed")
    data: list[str] | None = flag(
        None,
        "--data",
        key="data.paths",
        help="Text file/folder or .bin token file (repeatable); default: Python stdlib.",
    )
    baseline: bool = flag(
        False, "--baseline", help="Also run DataParallel with fp32 on the same data and tokens."
    )
    intruders: int = flag(
        0,
        "--intruders",
        min=0,
        max=16,
        help="Non-admitted processes attacking the run throughout (a clean run goes first, a "
        "control without commit certificates after).",
    )
    colluders: int = flag(
        0,
        "--colluders",
        min=0,
        max=16,
        help="Admitted processes planting a forged state one round ahead, certified as their own "
        "group; rank 0 then also claims weight 1e30 in every round (clean run first, control "
        "after).",
    )
    chaos: str | None = flag(
        None,
        "--chaos",
        metavar="SPEC",
        help="Kill/preempt random peers and restart them, e.g. kill=2/min,preempt=1/min,restart=20s "
        "(a clean run goes first).",
    )
    json_path: Path | None = flag(None, "--json", help="Write the results as JSON here.")
    config: Path | None = flag(None, "--config", "-c", help="TOML config file.")
    timeout: float = flag(3600.0, "--timeout", min=10, help="Seconds before giving up.")
    stages: int | None = flag(None, "--stages", key="swarm.stages", min=2, help="swarm: pipeline stages [2].")
    trainers: int | None = flag(
        None, "--trainers", key="swarm.trainers", min=1, max=16, help="swarm: trainers [1]."
    )
    activation_codec: str | None = flag(
        None,
        "--activation-codec",
        key="swarm.codec",
        help="swarm: codec of hidden states and their gradients between stages [none].",
    )
    kill_servers: int = flag(
        0, "--kill-servers", min=0, help="swarm: SIGKILL this many servers at random moments mid-run."
    )
    byzantine_servers: int = flag(
        0, "--byzantine-servers", min=0, help="swarm: this many servers send their replies x(-10)."
    )
    swarm_verify: float | None = flag(
        None, "--swarm-verify", key="swarm.verify_rate", min=0.0, max=1.0, help="swarm: checked share [0.1]."
    )
    topology: Path | None = flag(
        None, "--topology", help="Place the peers in emulated regions (TOML: RTTs, Mbit/s; root only)."
    )

    @property
    def swarm(self) -> bool:
        """A SWARM run (``--strategy swarm`` or one of its own flags): ``simulate_swarm`` runs it."""
        own = (self.stages, self.trainers, self.activation_codec, self.swarm_verify)
        faults = bool(self.kill_servers or self.byzantine_servers)
        return self.strategy == "swarm" or any(v is not None for v in own) or faults

    def given(self, sections: tuple[str, ...], but: tuple[str, ...] = ()) -> list[str]:
        """The flags given that set a key in one of the config ``sections`` (but the keys ``but``)."""
        return given_flags(self, sections, but)

    def overrides(self) -> dict[str, Any]:
        """The flags as dotted config keys (the highest config layer)."""
        return {**config_overrides(self), "peers.min_peers": min(2, self.peers)}

    def load_config(self) -> Config:
        """The run's config: simulate's own defaults below the config file, the environment and the flags.

        Raises:
            ConfigError: one line naming the problem.
        """
        from swarmtrain.core.config import load_config

        base = SIMULATE_DEFAULTS
        if self.intruders or self.colluders:  # three runs (clean, attacked, control): shorter ones
            base = {**base, "train": {**base["train"], "steps": ATTACKED_STEPS}}
        base = crowded_defaults(base, self.peers)  # many peers on few cores: below config and flags
        return load_config(self.config, self.overrides(), base=base)


@command(SimulateOptions)
def simulate(opts: SimulateOptions) -> None:
    """Train with N real peer processes on this machine (127.0.0.1) and report loss and bytes.

    Defaults: the tiny preset, 300 steps per peer of batch 16 x 128, DiLoCo with H=30 and the
    int8 codec. With --baseline, DataParallel with fp32 runs on the same data and tokens. The run
    admits its peers as `swarmtrain run init` would: its own run key and a join token per peer
    (set peers.admission to allowlist or open in --config to simulate those policies). With
    --intruders K (outsiders) and/or --colluders C (admitted donors planting a forged state), the run
    is made three times, each with one peer restarted mid-run (a newcomer that downloads the state):
    clean, attacked, and a control with the same attacks where states are taken without commit
    certificates (120 steps each by default); the exit code is 1 when the attacks had any effect on
    the attacked run, and a warning says so when the control showed none. With --chaos SPEC, the
    same run is made twice: clean, then with peers SIGKILLed (kill=RATE), SIGTERMed (preempt=RATE)
    and restarted with the same identity after a delay (restart=DELAY); the survivors must end
    identical, the loss is compared.
    A peer that dies is absorbed: the others go on and the report says who died when.
    With --strategy swarm (SWARM pipeline parallelism): --peers stage servers spread over --stages,
    --trainers peers feeding --steps micro-batches each, --activation-codec the codec between stages
    [none] (--stages, --trainers and --activation-codec set the config's [swarm] section, which sets
    the rest), --kill-servers K servers SIGKILLed mid-run (or --chaos SPEC: servers killed, preempted
    and restarted); the exit code is 1 when a micro-batch was lost or a stage's replicas differ at
    the end. With --topology FILE.toml (root), each peer runs in
    its own network namespace in a region, its link rate-capped and delayed as the file says.
    """
    run_simulate(opts)


def run_simulate(opts: SimulateOptions) -> None:
    """Run the simulation ``opts`` asks for (and its baseline), print the table, write the JSON.

    Raises:
        typer.Exit: code 1 when the peers did not end with identical parameters, or when a
            Streaming DiLoCo fragment committed no round while others did (``rounds_per_fragment``
            in the JSON; ``params_identical`` is then false).
    """
    from rich.console import Console

    from swarmtrain.simulation.chaos import parse_chaos

    regions_line = _check_topology(opts)
    if opts.swarm:
        from swarmtrain.app.commands.simulate_swarm import run_swarm_simulate

        # SWARM is no data-parallel strategy: its own runner, its settings the config's [swarm]
        return run_swarm_simulate(opts, replace(opts, strategy=None).load_config)
    cfg = opts.load_config()
    validate_names(cfg, opts.peers)  # names and attacks fail here, before any process starts
    chaos = parse_chaos(opts.chaos) if opts.chaos is not None else None
    console = Console(stderr=True)
    _print_start(console, cfg, opts, regions_line)
    runs, main, clean, base = _runs(console, cfg, opts, chaos)
    Console().print(_table(runs))
    out = _summary(cfg, main, base)
    if opts.topology is not None:
        out["topology"] = {"file": str(opts.topology), **main.network}
    if base is not None:
        _compare_baseline(out, cfg, main, base)
    harmed = _report_faults(out, cfg, opts, main, clean, chaos)
    if opts.json_path is not None:
        opts.json_path.parent.mkdir(parents=True, exist_ok=True)
        opts.json_path.write_text(dumps(out, indent=2) + "\n")
        typer.echo(f"wrote {opts.json_path}")
    _exit_on_failure(runs, main, base, harmed)


def _check_topology(opts: SimulateOptions) -> str | None:
    """``--topology``'s one-line description of the regions; a bad file or no root is one line,
    before any process starts."""
    if opts.topology is None:
        return None
    from swarmtrain.simulation.regions import check_topology

    return check_topology(opts.topology, opts.peers, strategy=opts.strategy, intruders=opts.intruders)


def _label(cfg: Config) -> str:
    return f"{cfg.strategy.name}+{cfg.compression.codec}"


def _print_start(console: Any, cfg: Config, opts: SimulateOptions, regions_line: str | None) -> None:
    """What will run: peers, steps, strategy and codec, model, data and regions."""
    from swarmtrain.app.data import describe_data

    console.print(
        f"swarmtrain simulate: {opts.peers} peers x {cfg.train.steps} steps, {_label(cfg)}, "
        f"{cfg.model.preset} model",
        highlight=False,
        soft_wrap=True,
    )
    console.print(describe_data(cfg.data), highlight=False, markup=False, soft_wrap=True)  # paths whole
    if opts.topology is not None:
        console.print(
            f"topology {opts.topology}: {regions_line}", highlight=False, markup=False, soft_wrap=True
        )


def _runs(
    console: Any, cfg: Config, opts: SimulateOptions, chaos: Any
) -> tuple[
    list[tuple[str, SimulationResult]], SimulationResult, SimulationResult | None, SimulationResult | None
]:
    """The runs: a clean one first (under intruders or chaos), the asked one, the baseline (with
    ``--baseline``); returns them labelled for the table, then the main, clean and baseline runs."""
    strategy, compressor = cfg.strategy.name, cfg.compression.codec
    clean = None
    runs = []
    attacked = bool(opts.intruders or opts.colluders)
    # attacked: each run has the newcomer event (a restart mid-run), so a state is downloaded
    event = {"newcomer": True} if attacked else {}
    if attacked or chaos is not None:
        clean = _run_one(console, f"{_label(cfg)} clean", cfg, opts, **event)
        runs.append((f"{strategy} {compressor} clean", clean))
    if chaos is not None:
        console.print(f"chaos: {chaos.describe()}", highlight=False, soft_wrap=True)
    attacks = {"intruders": opts.intruders, "colluders": opts.colluders, **event}
    hit = _attacked(cfg, opts)
    main = _run_one(console, _label(cfg), hit, opts, chaos=chaos, **attacks)
    label = f"{strategy} {compressor}" + (f" +{opts.intruders} intruders" if opts.intruders else "")
    label += f" +{opts.colluders} colluders" if opts.colluders else ""
    label += " chaos" if chaos is not None else ""
    runs.append((label, main))
    if attacked:  # the same attacks without the defences: they must act there
        main.control = _run_one(console, f"{_label(cfg)} control", hit, opts, old_state_rules=True, **attacks)
    base = None
    if opts.baseline:
        base = _run_one(console, "data_parallel+fp32", _baseline_config(cfg), opts)
        runs.append(("data_parallel fp32", base))
    return runs, main, clean, base


#: strategies whose rounds reduce weighted updates (an in-group weight attack can act on them)
_WEIGHTED = ("diloco", "streaming_diloco", "data_parallel")


def _attacked(cfg: Config, opts: SimulateOptions) -> Config:
    """The attacked runs' configuration: with colluders, rank 0 is an admitted member that claims
    weight 1e30 for its honest update in every round (the in-group weight attack, ``inflated_weight``),
    where the strategy reduces weighted updates and no ``--byzantine`` attack is set; else ``cfg``."""
    sim = cfg.simulation
    if not opts.colluders or sim.attackers or sim.malicious_owners or cfg.strategy.name not in _WEIGHTED:
        return cfg
    return cfg.model_copy(
        update={"simulation": sim.model_copy(update={"attackers": 1, "attack": "inflated_weight"})}
    )


def _compare_baseline(
    out: dict[str, Any], cfg: Config, main: SimulationResult, base: SimulationResult
) -> None:
    """The loss ratio and the bytes saved against the baseline: into ``out`` and one line."""
    out["loss_ratio"] = main.final_val_loss / base.final_val_loss
    out["bytes_reduction"] = base.bytes_sent_per_peer / max(main.bytes_sent_per_peer, 1.0)
    typer.echo(
        f"{_label(cfg)}: val loss {main.final_val_loss:.4f} vs {base.final_val_loss:.4f} "
        f"({(out['loss_ratio'] - 1) * 100:+.1f}%), {out['bytes_reduction']:.0f}x fewer bytes sent"
    )


def _report_faults(
    out: dict[str, Any],
    cfg: Config,
    opts: SimulateOptions,
    main: SimulationResult,
    clean: SimulationResult | None,
    chaos: Any,
) -> bool:
    """What the intruders, the chaos or the faults did: into ``out`` and one line each; returns
    whether the intruders had any effect."""
    from swarmtrain.app.commands.chaos_report import chaos_fields, chaos_line, events_text

    harmed = False
    if clean is not None and (opts.intruders or opts.colluders):
        from swarmtrain.app.commands.intruder_report import intruder_fields

        sim = _attacked(cfg, opts).simulation
        intr, harmed, lines = intruder_fields(main, clean, main.control, sim.attackers, sim.malicious_owners)
        intr["weight_attackers"] = sim.attackers if sim.attack == "inflated_weight" else 0
        out.update(intr)
        for line in lines:
            typer.echo(line, err=line.startswith("warning"))
    if chaos is not None and clean is not None:
        out.update(chaos_fields(main, clean, chaos))
        typer.echo(chaos_line(out), err=False)
    elif main.timeline:
        typer.echo(f"{len(main.timeline)} fault(s) absorbed: {events_text(main.timeline)}")
    return harmed


def _summary(cfg: Config, main: SimulationResult, base: SimulationResult | None) -> dict[str, Any]:
    """The JSON's run fields: the run's summary, its baseline's figures and each peer's rounds."""
    return {
        **main.summary(),
        "inner_steps": getattr(cfg.strategy, "inner_steps", None),
        "baseline_val_loss": base.final_val_loss if base else None,
        "baseline_bytes_sent_per_peer": base.bytes_sent_per_peer if base else None,
        "baseline_params_identical": base.params_identical if base else None,
        "baseline_wall_s": base.wall_s if base else None,
        "rounds_per_peer": [
            {"rank": o.rank, "committed": o.committed_rounds, "failed": o.failed_rounds}
            for o in main.outcomes
        ],
    }


def _exit_on_failure(
    runs: list[tuple[str, SimulationResult]],
    main: SimulationResult,
    base: SimulationResult | None,
    harmed: bool,
) -> None:
    """Exit 1 with one line when a run failed: a stalled fragment, peers that disagree, no round
    committed, or intruders that had an effect."""
    for label, res in runs:
        stalled = res.stalled_fragments
        if stalled:
            per = res.rounds_per_fragment
            failed = ", ".join(f"fragment {f}: {per[f]['failed']} failed" for f in stalled)
            typer.echo(
                f"error: {label}: committed no round of {failed}, while other fragments committed "
                "(run with -v for why)",
                err=True,
            )
            raise typer.Exit(1)
    if not main.params_identical or (base is not None and not base.params_identical):
        typer.echo("warning: peers did not end with identical parameters", err=True)
        raise typer.Exit(1)
    for label, res in runs:
        if any(o.failed_rounds for o in res.outcomes) and not any(o.committed_rounds for o in res.outcomes):
            typer.echo(f"error: {label}: no peer committed a single round (run with -v for why)", err=True)
            raise typer.Exit(1)
    if harmed:
        typer.echo("error: the intruders had an effect on the run (see intruder_effects)", err=True)
        raise typer.Exit(1)


#: seconds between plain progress lines when stderr is not a terminal
PLAIN_EVERY_S = 15.0


def _run_one(console: Any, label: str, cfg: Config, opts: SimulateOptions, **kw: Any) -> Any:
    """One simulated run with a live line (on a terminal): the slowest peer's step, the newest round
    and its peers, the mean loss, the peers' summed tokens/s and bytes, the nearest next sync; piped
    or redirected, that line with a timestamp every :data:`PLAIN_EVERY_S` seconds."""
    import time

    from swarmtrain.app.peer.live import combine, format_status
    from swarmtrain.simulation.regions import emulated_regions
    from swarmtrain.simulation.runner import run_simulation

    starting = f"{label}: starting {opts.peers} peers"
    with emulated_regions(opts.topology, opts.peers) as net, console.status(starting) as status:
        seen: dict[int, PeerStatus] = {}
        last = [time.monotonic()]

        def progress(rank: int, s: PeerStatus) -> None:
            seen[rank] = s
            if len(seen) < opts.peers:
                return
            agg = combine(list(seen.values()))
            # a terminal: the line beside the spinner fits it; piped: every figure, after a timestamp
            width = max(console.width - len(label) - 5, 30) if console.is_terminal else 77
            line = f"{label}: {format_status(agg, width, total=cfg.train.steps)}"
            status.update(line)
            if not console.is_terminal and time.monotonic() - last[0] >= PLAIN_EVERY_S:
                last[0] = time.monotonic()
                console.print(f"{time.strftime('%H:%M:%S')} {line}", highlight=False, soft_wrap=True)

        res = run_simulation(cfg, opts.peers, timeout=opts.timeout, on_progress=progress, regions=net, **kw)
        if net is not None:
            res.network = net.report()  # the JSON's "topology" (run_simulate)
        return res


def _baseline_config(cfg: Config) -> Config:
    """``cfg`` with DataParallel and fp32 (no codec, no error feedback): the comparison every
    strategy needs, on the same model, data, seed and tokens."""
    from swarmtrain.core.config import DataParallelConfig

    sync = getattr(cfg.strategy, "sync_timeout", None)
    strategy = DataParallelConfig() if sync is None else DataParallelConfig(sync_timeout=sync)
    compression = cfg.compression.model_copy(update={"codec": "none", "error_feedback": "none"})
    return cfg.model_copy(update={"strategy": strategy, "compression": compression}, deep=True)


def register(app: typer.Typer) -> None:
    """Add ``simulate`` to the CLI."""
    app.command("simulate")(simulate)
