"""``docs/benchmarks.md`` is what ``benchmarks/docs_tables.py`` renders from the committed JSON, so a
table left stale after a new run fails here; and the README (the user's guide) points at it."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _docs_tables() -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_docs_tables", BENCH / "docs_tables.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_docs_tables"] = mod
    spec.loader.exec_module(mod)
    return mod


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_committed_doc_is_the_generators_output() -> None:
    dt = _docs_tables()
    committed = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert committed == dt.render(), "docs/benchmarks.md is stale: run python benchmarks/docs_tables.py"


def test_every_placeholder_has_a_table_and_every_table_its_json() -> None:
    dt = _docs_tables()
    template = dt.TEMPLATE.read_text(encoding="utf-8")
    used = set(dt.PLACEHOLDER.findall(template))
    assert used == set(dt.TABLES), f"unused tables {set(dt.TABLES) - used}, unknown {used - set(dt.TABLES)}"
    for name, (files, _) in dt.TABLES.items():
        for f in files:
            assert (dt.RESULTS / f).is_file(), (name, f)
    assert "{{" not in dt.render()


def test_readme_links_to_benchmarks_resolve() -> None:
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    anchors = {_slug(line.lstrip("#")) for line in doc.splitlines() if line.startswith("#")}
    links = re.findall(r"\(docs/benchmarks\.md#([^)]+)\)", readme)
    assert links, "the README no longer links to the benchmark tables"
    assert set(links) <= anchors, sorted(set(links) - anchors)
    own = {_slug(line.lstrip("#")) for line in readme.splitlines() if line.startswith("#")}
    inner = set(re.findall(r"\]\(#([^)]+)\)", readme))
    assert inner <= own, sorted(inner - own)


def test_readme_starts_with_the_two_commands_and_ci_runs_the_second_verbatim() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", readme, re.S)
    assert block is not None and readme.index("```bash") < readme.index("\n## ")
    commands = [line for line in block.group(1).splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert "swarmtrain simulate" in commands[0] and commands[1].endswith("python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert commands[1] in ci, ".ci/run no longer runs the README's second command verbatim"
