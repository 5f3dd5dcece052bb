"""The chaos table of ``docs/benchmarks.md`` is the committed ``benchmarks/results/chaos.json`` as
``benchmarks/chaos.py`` renders it (the doc's figures come from the JSON a benchmark wrote)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def test_doc_chaos_table_is_the_committed_json() -> None:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import chaos

    doc = json.loads((BENCH / "results" / "chaos.json").read_text(encoding="utf-8"))
    table = chaos.markdown_table(doc)
    doc_md = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert table in doc_md, (
        f"docs/benchmarks.md's chaos table differs from chaos.json; regenerate it:\n{table}"
    )
    assert {r["strategy"] for r in doc["rows"]} >= {"diloco", "streaming_diloco", "demo"}
