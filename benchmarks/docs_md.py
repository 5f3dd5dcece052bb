"""Helpers of ``benchmarks/docs_tables.py``'s tables: the committed JSON and Markdown cells."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
MiB = 2**20

__all__ = ["RESULTS", "MiB", "load", "_md", "_yes", "_range"]


def load(name: str) -> Any:
    """``benchmarks/results/<name>``, parsed."""
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _md(head: list[str], rows: list[list[str]], align: str | None = None) -> str:
    """A Markdown table; ``align`` is one character per column (``l`` or ``r``), default all plain."""
    sep = ["---:" if a == "r" else "---" for a in (align or "l" * len(head))]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(sep) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _yes(x: Any) -> str:
    return {True: "yes", False: "**no**"}.get(x, "-")


def _range(pair: list[float], fmt: str) -> str:
    lo, hi = pair
    return f"{lo:{fmt}}-{hi:{fmt}}" if f"{lo:{fmt}}" != f"{hi:{fmt}}" else f"{lo:{fmt}}"
