"""The dependency direction of DESIGN.md section 2, checked by walking every module's imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Modules of the swarmtrain *core* (may import only third-party libraries and each other).
CORE = {"errors", "registry", "config", "protocols", "packet", "wire"}

ALLOWED: dict[str, set[str]] = {
    "swarmtrain.core": {"swarmtrain"},
    "compression": {"swarmtrain", "compression"},
    "optimizers": {"swarmtrain", "compression", "optimizers"},
    "peers": {"swarmtrain", "compression", "peers"},
}
OURS = {"swarmtrain", "compression", "optimizers", "peers"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "swarmtrain" and len(rel.parts) == 2 and rel.stem in CORE:
        return "swarmtrain.core"
    return rel.parts[0]


def test_no_forbidden_import_edges() -> None:
    bad: list[str] = []
    for pkg in ("swarmtrain", "compression", "optimizers", "peers"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            owner = _package_of(path)
            allowed = ALLOWED.get(owner)
            if allowed is None:  # the swarmtrain app layer may import everything
                continue
            for name in _imports(path):
                top = name.split(".")[0]
                if top not in OURS:
                    continue
                if owner == "swarmtrain.core":
                    mod = name.split(".")[1] if "." in name else ""
                    if top != "swarmtrain" or (mod and mod not in CORE):
                        bad.append(f"{path.relative_to(ROOT)} imports {name}")
                elif top not in allowed:
                    bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "forbidden import edges:\n" + "\n".join(bad)


def test_libp2p_never_imported_beside_hivemind() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for pkg in ("swarmtrain", "compression", "optimizers", "peers")
        for p in (ROOT / pkg).rglob("*.py")
        if any(n.split(".")[0] == "libp2p" for n in _imports(p))
    ]
    assert not offenders, f"py-libp2p must live in its own processes: {offenders}"
