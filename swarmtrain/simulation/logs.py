"""Logging of the simulation's child processes."""

from __future__ import annotations

import logging

from swarmtrain.app.logs import quiet_third_party

__all__ = ["quiet_logs"]


def quiet_logs(level: int) -> None:
    """Log at ``level`` with the process name on every line; hivemind only from ERROR up."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s")
    logging.getLogger("hivemind").setLevel(max(level, logging.ERROR))
    quiet_third_party(level <= logging.DEBUG)
