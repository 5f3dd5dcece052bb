"""The dependency direction of ``docs/architecture.md``, checked from the source (AST), so it stays true.

- ``swarmtrain.core`` imports only third-party libraries and itself;
- ``peers/`` and ``swarmtrain/app/`` are split by concern into subpackages whose imports run one way
  (``PEERS_LAYERS``, ``APP_LAYERS``); no module sits directly in ``peers/`` but its package face;
- the library packages (``compression``, ``optimizers``, ``peers``) import only the core and the
  packages below them, never the app (``swarmtrain.app``) or the simulation (``swarmtrain.simulation``);
- nothing outside ``swarmtrain.simulation`` and the CLI's simulate command imports the simulation;
- the module import graph has no cycle (imports inside functions count: they are edges too).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("swarmtrain", "compression", "optimizers", "peers")

# owner -> top-level import names it may use (beyond itself and third-party libraries)
ALLOWED: dict[str, set[str]] = {
    "swarmtrain.core": {"swarmtrain.core"},
    "compression": {"swarmtrain.core", "compression"},
    "optimizers": {"swarmtrain.core", "compression", "optimizers"},
    "peers": {"swarmtrain.core", "compression", "peers"},
}
# peers/ by concern: subpackage -> the other peers subpackages it may import (a DAG: no cycle between them)
PEERS_LAYERS: dict[str, set[str]] = {
    "peers.keys": set(),  # identity and signatures
    "peers.wire": set(),  # bytes on streams: transport, channels, messages, mailbox, ledger
    "peers.reducers": set(),  # pure aggregation rules
    "peers.trust": {"peers.keys"},  # admission, manifest, suspicion, the owner check's rules
    "peers.dht": {"peers.keys", "peers.wire", "peers.trust"},  # node, records, probes, processes
    "peers.state": {"peers.keys", "peers.wire", "peers.trust", "peers.dht"},  # state transfer, certificates
    # rounds read the certified history (peers.rounds.seats) from peers.state
    "peers.rounds": {"peers.keys", "peers.wire", "peers.trust", "peers.dht", "peers.reducers", "peers.state"},
    "peers.swarm": {"peers.keys", "peers.wire", "peers.trust", "peers.dht", "peers.rounds", "peers.state"},
}
# swarmtrain/app/ by concern; a top-level app module (cli, logs, units, local_run) is its own unit
APP_LAYERS: dict[str, set[str]] = {
    "swarmtrain.app.units": set(),
    "swarmtrain.app.local_run": set(),
    "swarmtrain.app.logs": set(),
    "swarmtrain.app.models": set(),
    "swarmtrain.app.data": {"swarmtrain.app.units"},
    "swarmtrain.app.train": {"swarmtrain.app.models", "swarmtrain.app.data", "swarmtrain.app.units"},
    "swarmtrain.app.peer": {"swarmtrain.app.train", "swarmtrain.app.models", "swarmtrain.app.data"},
    "swarmtrain.app.swarm": {
        "swarmtrain.app.peer",
        "swarmtrain.app.train",
        "swarmtrain.app.models",
        "swarmtrain.app.data",
    },
    "swarmtrain.app.bench": {"swarmtrain.app.peer", "swarmtrain.app.train", "swarmtrain.app.local_run"},
    "swarmtrain.app.doctor": {"swarmtrain.app.train", "swarmtrain.app.models", "swarmtrain.app.units"},
    "swarmtrain.app.dashboard": {"swarmtrain.app.units"},
}
# the only app modules that may reach the simulation package
SIMULATION_ENTRY = {
    "swarmtrain.app.commands.simulate",
    "swarmtrain.app.commands.simulate_swarm",
    "swarmtrain.app.commands.simulate_checks",  # simulate's name checks
    "swarmtrain.app.commands.intruder_report",  # simulate's intruder lines and fields
    "swarmtrain.app.commands.bench",
}


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _edges(module: str, path: Path) -> set[str]:
    """The project modules ``module`` imports: ``from a.b import c`` is an edge to ``a.b.c`` when that
    is a module, else to ``a.b`` (so ``from compression import native`` counts as importing the
    package ``compression`` and its ``__init__``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in MODULES else src for a in node.names]
        else:
            continue
        for t in targets:
            r = _resolve(t)
            if r is not None and r != module:
                out.add(r)
    return out


GRAPH = {m: _edges(m, p) for m, p in MODULES.items()}


def _owner(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "swarmtrain" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_forbidden_import_edges() -> None:
    bad: list[str] = []
    for mod, targets in sorted(GRAPH.items()):
        allowed = ALLOWED.get(_owner(mod))
        for t in sorted(targets):
            if allowed is not None and not any(_within(t, a) for a in allowed):
                bad.append(f"{mod} imports {t}")
            if (
                _within(t, "swarmtrain.simulation")
                and not _within(mod, "swarmtrain.simulation")
                and mod not in SIMULATION_ENTRY
            ):
                bad.append(f"{mod} imports the simulation package ({t})")
    assert not bad, "forbidden import edges:\n" + "\n".join(bad)


def test_the_package_root_imports_nothing_eagerly() -> None:
    """``swarmtrain/__init__.py`` re-exports lazily, so importing the core never runs the app."""
    assert GRAPH["swarmtrain"] <= {"swarmtrain.core", "swarmtrain.app.cli"}, GRAPH["swarmtrain"]


def _cycles() -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    cycles = _cycles()
    assert not cycles, f"import cycles: {cycles}"


def test_libp2p_never_imported_beside_hivemind() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if any(n.split(".")[0] == "libp2p" for n in _imports_raw(p))
    ]
    assert not offenders, f"py-libp2p must live in its own processes: {offenders}"


def _imports_raw(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_peer_layer_accepts_built_in_codecs_without_importing_compression_itself() -> None:
    """The wire's codec allow-list derives from the registry, which ``compression`` fills: a process
    that decodes peer packets before it builds a codec of its own (a member receiving a round's first
    parts early) refused every packet ("codec 'none' is not allowed")."""
    import subprocess
    import sys

    code = (
        "from peers.wire.messages import decode_packet_bytes, encode_packet_bytes\n"
        "from swarmtrain.core.packet import Packet\n"
        "p = Packet('none', (3,), 'float32', (bytes(12),), ())\n"
        "print(decode_packet_bytes(encode_packet_bytes(p)).codec)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "none", out.stderr[-2000:]


def _unit(module: str, layers: dict[str, set[str]]) -> str | None:
    return next((u for u in layers if _within(module, u)), None)


def _layer_violations(prefix: str, layers: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, targets in sorted(GRAPH.items()):
        if not _within(mod, prefix) or mod == prefix:
            continue
        src = _unit(mod, layers)
        for t in sorted(targets):
            dst = _unit(t, layers) if _within(t, prefix) else None
            if src is None or dst is None or dst == src:
                continue
            if dst not in layers[src]:
                bad.append(f"{mod} imports {t} ({src} may not import {dst})")
    return bad


def test_peers_subpackages_import_one_way() -> None:
    bad = _layer_violations("peers", PEERS_LAYERS)
    assert not bad, "\n".join(bad)


def test_app_subpackages_import_one_way() -> None:
    bad = _layer_violations("swarmtrain.app", APP_LAYERS)
    assert not bad, "\n".join(bad)


def test_every_peers_module_sits_in_a_subpackage() -> None:
    """``peers/`` holds only its package face; every module belongs to a subpackage of the rules."""
    loose = sorted(p.name for p in (ROOT / "peers").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules directly in peers/: {loose}"
    subpackages = {f"peers.{p.name}" for p in (ROOT / "peers").iterdir() if (p / "__init__.py").exists()}
    assert subpackages == set(PEERS_LAYERS), subpackages ^ set(PEERS_LAYERS)


def _rule_cycle(layers: dict[str, set[str]], u: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
    if u in path:
        return path + (u,)
    for v in sorted(layers.get(u, set())):
        found = _rule_cycle(layers, v, path + (u,))
        if found:
            return found
    return None


def test_the_layer_rules_have_no_cycle() -> None:
    for layers in (PEERS_LAYERS, APP_LAYERS):
        cycles = [c for u in layers if (c := _rule_cycle(layers, u, ()))]
        assert not cycles, f"cycle in the rules: {cycles[0]}"
