"""Run series of the benchmarks: ``benchmarks/results/<name>_runs.json``, written only by the scripts.

A benchmark that keeps a run series takes ``--append``: after writing its single-run JSON as usual it
calls ``append_run``, which adds one entry to ``<name>_runs.json``::

    {"benchmark": "<name>", "note": "...", "runs": [
        {"run": 1, "recorded": {"utc": ..., "loadavg": [1, 5, 15 min], "git_commit": ..., "git_dirty": ...,
                                "command": ...},
         ...the figures of that run (what the script chose to keep)...},
        ...]}

``run`` numbers count up from the last entry. The file is rewritten whole (read, append, write to a
temporary file, rename), so an interrupted append leaves the old file intact.

Every benchmark ends the same way, through ``write_report``: print its table, write its JSON (strict:
non-finite floats as ``null``), draw its PNG next to it (``pyplot`` + ``save_figure``), and say
``wrote <path>`` for each file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from swarmtrain.core.jsonsafe import finite

__all__ = [
    "finite",
    "RESULTS",
    "recorded",
    "git_commit",
    "loadavg",
    "append_run",
    "load_runs",
    "write_json",
    "write_report",
    "pyplot",
    "save_figure",
    "error_line",
    "median_range",
]

RESULTS = Path(__file__).resolve().parent / "results"


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``None`` where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # pragma: no cover - not on Linux
        return None


def git_commit(root: Path | None = None) -> tuple[str | None, bool | None]:
    """``(HEAD commit, whether tracked files differ from it)`` of the repository, or ``(None, None)``."""
    cwd = root or Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head or None, bool(dirty)


def recorded(argv: list[str] | None = None) -> dict[str, Any]:
    """When, under what load and at which commit a run was made, and the command that made it."""
    commit, dirty = git_commit()
    args = sys.argv if argv is None else argv
    return {
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg": loadavg(),
        "git_commit": commit,
        "git_dirty": dirty,
        "command": " ".join(shlex.quote(a) for a in ["python", *args]),
    }


def load_runs(path: Path, benchmark: str, note: str = "") -> dict[str, Any]:
    """The run series at ``path`` (an empty one if the file does not exist).

    Raises:
        ValueError: the file is not a run series of ``benchmark``.
    """
    if not path.exists():
        return {"benchmark": benchmark, "note": note, "runs": []}
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"{path}: not a run series (no 'runs' list)")
    if data.get("benchmark") != benchmark:
        raise ValueError(f"{path}: holds runs of {data.get('benchmark')!r}, not {benchmark!r}")
    return data


def append_run(
    path: Path,
    benchmark: str,
    run: Mapping[str, Any],
    *,
    note: str = "",
    record: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Append ``run`` (with its ``run`` number and ``recorded`` block) to the series at ``path``.

    Args:
        path: the ``*_runs.json`` file (created with ``note`` if missing).
        benchmark: the series' benchmark name; must match the file's.
        run: the figures of the run just measured (JSON-serialisable).
        note: the series' note, used only when the file is created.
        record: the ``recorded`` block; ``None``: ``recorded()`` now.

    Returns:
        The entry that was appended.
    """
    data = load_runs(path, benchmark, note)
    last = max((int(r.get("run", 0)) for r in data["runs"] if isinstance(r, dict)), default=0)
    entry = {"run": last + 1, "recorded": dict(record) if record is not None else recorded()}
    entry.update({k: v for k, v in run.items() if k not in ("run", "recorded")})
    data["runs"].append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return entry


def number(x: Any) -> float | None:
    """``x`` as a float when it is a finite number from a JSON report (not a bool), else ``None``."""
    ok = isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(float(x))
    return float(x) if ok else None


def median_range(values: list[float]) -> tuple[float | None, list[float] | None]:
    """The median of ``values`` and their ``[min, max]`` (a summary over runs); ``None``s when empty."""
    if not values:
        return None, None
    return statistics.median(values), [min(values), max(values)]


def cell(x: Any, fmt: str) -> str:
    """A table cell: ``x`` formatted with ``fmt``, or ``-`` when it is not a number."""
    return format(x, fmt) if isinstance(x, int | float) and not isinstance(x, bool) else "-"


def strategy_list(text: str, known: tuple[str, ...]) -> list[str]:
    """A ``--strategies a,b`` value, each one of ``known``.

    Raises:
        argparse.ArgumentTypeError: an unknown name or none.
    """
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown strategy {', '.join(bad)} (use {', '.join(known)})")
    return names


def write_json(path: Path, doc: Any, *, indent: int = 2, default: Callable[[Any], Any] | None = None) -> None:
    """``doc`` as strict JSON at ``path`` (non-finite floats as ``null``, a final newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(finite(doc), indent=indent, allow_nan=False, default=default)
    path.write_text(text + "\n", encoding="utf-8")


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only ``Agg`` backend (the benchmarks draw PNGs, no windows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """Write ``fig`` to ``path`` and release it."""
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def write_report(
    path: Path,
    doc: Any,
    table: str | Iterable[str] | None = None,
    *,
    plot: Callable[[Any, Path], None] | None = None,
    indent: int = 2,
    default: Callable[[Any], Any] | None = None,
) -> Path | None:
    """A benchmark's tail: print ``table``, write ``doc`` as JSON at ``path``, draw ``plot(doc, png)``
    next to it, and print ``wrote <path>`` for each file.

    Returns:
        The PNG's path, or ``None`` without ``plot``.
    """
    if table is not None:
        print(table if isinstance(table, str) else "\n".join(table))
    write_json(path, doc, indent=indent, default=default)
    png = None
    if plot is not None:
        png = path.with_suffix(".png")
        plot(doc, png)
    for written in (path, png):
        if written is not None:
            print(f"wrote {written}")
    return png


def error_line(stderr: str) -> str | None:
    """The line of a failed command's stderr that says why (its ``error:`` line, else the last)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    said = [ln for ln in lines if "error:" in ln]
    return (said[-1] if said else lines[-1] if lines else "")[:300] or None
