"""The result of one doctor check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Check", "Status", "STATUSES"]

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "skip")


@dataclass(frozen=True)
class Check:
    """One check's outcome.

    Attributes:
        name: what was checked (``p2p daemon``, ``reachability``, ``peer 3xYz...``, ``throughput cpu``).
        status: ``ok``, ``warn`` (works, with a caveat), ``fail`` (does not work) or ``skip`` (not run).
        figure: the measured figure in a few characters (``0.21 s``, ``4.1k tok/s``), or ``-``.
        detail: one line saying what it means.
        data: the figures as numbers (or short strings) for ``--json``.
    """

    name: str
    status: Status
    figure: str = "-"
    detail: str = ""
    data: dict[str, float | int | str | None] = field(default_factory=dict)
