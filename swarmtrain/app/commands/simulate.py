"""``swarmtrain simulate``: a bootstrap node and N real peers on 127.0.0.1, optionally vs a baseline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

__all__ = ["register"]

_BASELINE_STRATEGY = "data_parallel"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def _table(rows: list[Any]) -> Any:
    from rich.table import Table

    t = Table(title="swarmtrain simulate")
    cols = ("run", "peers", "tokens", "final val loss", "sent / peer", "bytes / token", "identical", "wall")
    for col in cols:
        t.add_column(col, justify="right" if col not in ("run", "identical") else "left")
    for label, r in rows:
        t.add_row(
            label,
            str(r.peers),
            f"{r.tokens:,}",
            f"{r.final_val_loss:.4f}",
            _fmt_bytes(r.bytes_sent_per_peer),
            f"{r.bytes_per_token:.3f}",
            "yes" if r.params_identical else "NO",
            f"{r.wall_s:.0f} s",
        )
    return t


def register(app: typer.Typer) -> None:
    @app.command("simulate")
    def simulate(
        peers: int = typer.Option(4, "--peers", "-n", min=1, max=64, help="Training peers to start."),
        strategy: str | None = typer.Option(None, "--strategy", "-s", help="Strategy [default: diloco]."),
        compressor: str | None = typer.Option(None, "--compressor", help="Codec name [default: int8]."),
        steps: int | None = typer.Option(None, "--steps", min=1, help="Local steps per peer."),
        inner_steps: int | None = typer.Option(None, "--inner-steps", "-H", min=1, help="DiLoCo H [30]."),
        fragments: int | None = typer.Option(None, "--fragments", min=1, help="StreamingDiLoCo: F."),
        overlap: int | None = typer.Option(None, "--overlap", min=0, help="StreamingDiLoCo: tau steps."),
        mixing: float | None = typer.Option(None, "--mixing", min=0.0, max=1.0, help="Streaming: alpha."),
        error_feedback: str | None = typer.Option(None, "--error-feedback", help="none, ef or ef21."),
        reducer: str | None = typer.Option(None, "--reducer", help="Aggregation rule (default mean)."),
        byzantine: int | None = typer.Option(
            None, "--byzantine", min=0, help="How many peers attack (ranks 0..K-1; see --attack)."
        ),
        attack: str | None = typer.Option(
            None,
            "--attack",
            help="Attack the Byzantine peers run: sign_flip, random_direction, gaussian_noise, label_flip, "
            "alie, ipm, stale, malicious_owner.",
        ),
        tolerate: int | None = typer.Option(None, "--tolerate", min=0, help="f the reducer tolerates."),
        malicious_owners: int | None = typer.Option(
            None, "--malicious-owners", min=0, help="Ranks after the attackers that return wrong aggregates."
        ),
        owner_check: bool | None = typer.Option(
            None, "--owner-check/--no-owner-check", help="Replicated-owner check, suspicion and bans."
        ),
        preset: str | None = typer.Option(None, "--preset", help="Model preset (default tiny)."),
        batch_size: int | None = typer.Option(None, "--batch-size", min=1),
        lr: float | None = typer.Option(None, "--lr", help="Inner learning rate."),
        seed: int | None = typer.Option(None, "--seed"),
        baseline: bool = typer.Option(
            False, "--baseline", help="Also run DataParallel with fp32 on the same data and tokens."
        ),
        json_path: Path | None = typer.Option(None, "--json", help="Write the results as JSON here."),
        config: Path | None = typer.Option(None, "--config", "-c", help="TOML config file."),
        timeout: float = typer.Option(3600.0, "--timeout", min=10, help="Seconds before giving up."),
    ) -> None:
        """Train with N real peer processes on this machine (127.0.0.1) and report loss and bytes.

        Defaults: the tiny preset, 300 steps per peer of batch 16 x 128, DiLoCo with H=30 and the
        int8 codec. With --baseline, DataParallel with fp32 runs on the same data and tokens.
        """
        from rich.console import Console

        from swarmtrain.core.config import load_config, strategy_config
        from swarmtrain.simulation.runner import run_simulation

        overrides: dict[str, Any] = {
            "strategy.name": strategy,
            "compression.codec": compressor,
            "train.steps": steps,
            "strategy.inner_steps": inner_steps,
            "strategy.fragments": fragments,
            "strategy.overlap": overlap,
            "strategy.mixing": mixing,
            "compression.error_feedback": error_feedback,
            "peers.reducer": reducer,
            "simulation.attackers": byzantine,
            "simulation.attack": attack,
            "peers.byzantine_f": tolerate,
            "simulation.malicious_owners": malicious_owners,
            "peers.owner_check": owner_check,
            "model.preset": preset,
            "train.batch_size": batch_size,
            "train.lr": lr,
            "train.seed": seed,
            "peers.min_peers": min(2, peers),
        }
        # simulate's own defaults sit below the config file, the environment and the flags
        defaults = {
            "strategy": {"name": "diloco", "inner_steps": 30},
            "compression": {"codec": "int8"},
            "train": {"steps": 300, "eval_interval": 10_000},
        }
        cfg = load_config(config, overrides, base=defaults)
        strategy, compressor = cfg.strategy.name, cfg.compression.codec
        # validate names before starting any process
        _validate_names(cfg, peers)
        console = Console(stderr=True)
        runs = []

        def one(label: str, c: Any) -> Any:
            with console.status(f"{label}: starting {peers} peers") as status:
                seen: dict[int, int] = {}

                def progress(rank: int, step: int, loss: float) -> None:
                    seen[rank] = step
                    done = min(seen.values()) if len(seen) == peers else 0
                    status.update(f"{label}: step {done}/{c.train.steps}, loss {loss:.3f}")

                return run_simulation(c, peers, timeout=timeout, on_progress=progress)

        main = one(f"{strategy}+{compressor}", cfg)
        runs.append((f"{strategy} {compressor}", main))
        base = None
        if baseline:
            bcfg = cfg.model_copy(deep=True)
            # strategy options are frozen and per strategy: the baseline keeps only the sync timeout
            bcfg.strategy = strategy_config(
                _BASELINE_STRATEGY, **cfg.strategy.model_dump(include={"sync_timeout"})
            )
            bcfg.compression.codec = "none"
            bcfg.compression.error_feedback = "none"
            base = one("data_parallel+fp32", bcfg)
            runs.append(("data_parallel fp32", base))
        Console().print(_table(runs))
        out: dict[str, Any] = {
            **main.summary(),
            "inner_steps": getattr(cfg.strategy, "inner_steps", None),  # None: no H in this strategy
            "baseline_val_loss": base.final_val_loss if base else None,
            "baseline_bytes_sent_per_peer": base.bytes_sent_per_peer if base else None,
            "baseline_params_identical": base.params_identical if base else None,
            "baseline_wall_s": base.wall_s if base else None,
        }
        if base is not None:
            out["loss_ratio"] = main.final_val_loss / base.final_val_loss
            out["bytes_reduction"] = base.bytes_sent_per_peer / max(main.bytes_sent_per_peer, 1.0)
            typer.echo(
                f"{strategy}+{compressor}: val loss {main.final_val_loss:.4f} vs {base.final_val_loss:.4f} "
                f"({(out['loss_ratio'] - 1) * 100:+.1f}%), {out['bytes_reduction']:.0f}x fewer bytes sent"
            )
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(out, indent=2) + "\n")
            typer.echo(f"wrote {json_path}")
        if not main.params_identical or (base is not None and not base.params_identical):
            typer.echo("warning: peers did not end with identical parameters", err=True)
            raise typer.Exit(1)


def _validate_names(cfg: Any, n_peers: int) -> None:
    """Resolve registry names early, so a typo fails in one line before any process starts."""
    import optimizers
    from compression import build_compressor
    from peers.reducers import REDUCERS

    optimizers.STRATEGIES.get(cfg.strategy.name)
    build_compressor(cfg.compression)
    REDUCERS.get(cfg.peers.reducer)
    if cfg.simulation.attackers and cfg.simulation.attack != "none":
        from peers.reducers import build_reducer
        from swarmtrain.core.errors import ConfigError
        from swarmtrain.simulation.attacks import build_attack
        from swarmtrain.simulation.runner import attack_options

        if cfg.simulation.attackers >= n_peers:
            raise ConfigError(f"--byzantine {cfg.simulation.attackers} leaves no honest peer among {n_peers}")
        build_reducer(cfg.peers.reducer, cfg.peers.byzantine_f, **cfg.peers.reducer_options)
        # every registered attack runs with real peers; this rejects an unknown name or bad options
        build_attack(cfg.simulation.attack, **attack_options(cfg, n_peers))
    from swarmtrain.simulation.runner import check_attack_fits_strategy

    check_attack_fits_strategy(cfg)
