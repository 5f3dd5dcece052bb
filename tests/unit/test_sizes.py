"""Files and functions sized by concept (issue 29, point 5), checked from the source (AST).

No module of the library and app code (``swarmtrain/``, ``peers/``, ``optimizers/``, ``compression/``)
is over :data:`MAX_FILE_LINES` lines, and no function (or method) over :data:`MAX_FUNCTION_LINES`,
counting from its ``def`` through its last line (decorators aside). Code over the limits is split
along concepts (a module per job, a helper per step), not trimmed: see ``docs/architecture.md``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("swarmtrain", "peers", "optimizers", "compression")
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 60


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    rel = path.relative_to(ROOT)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return out


def test_the_sources_are_found() -> None:
    assert len(_sources()) > 100


def test_no_file_over_the_limit() -> None:
    long = []
    for path in _sources():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_FILE_LINES:
            long.append(f"{path.relative_to(ROOT)}: {n} lines")
    assert not long, f"files over {MAX_FILE_LINES} lines:\n" + "\n".join(long)


def test_no_function_over_the_limit() -> None:
    long = [line for path in _sources() for line in _long_functions(path)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)
