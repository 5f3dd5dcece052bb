"""``swarmtrain train``: a single-peer run of the local training loop."""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        config: str | None = typer.Option(None, "--config", "-c", help="TOML config file."),
    ) -> None:
        """Train on this machine alone (strategy 'local')."""
        raise NotImplementedError
