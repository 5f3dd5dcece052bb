"""``benchmarks/gpu_codecs.py``: the codecs section runs on the CPU at tiny sizes with a complete,
NaN-free report; on a GPU (``-k cuda``) at a small size, with the device path identical to the CPU's."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_codecs.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu_codecs", _PATH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _numbers(obj: Any) -> list[float]:
    if isinstance(obj, dict):
        return [v for x in obj.values() for v in _numbers(x)]
    if isinstance(obj, float):
        return [obj]
    return []


def _check(doc: dict[str, Any]) -> None:
    json.dumps(doc, allow_nan=False)  # no NaN or inf anywhere
    assert all(math.isfinite(v) for v in _numbers(doc))
    assert set(doc["codecs"]) == {"int8", "ternary"}
    for r in doc["codecs"].values():
        assert r["identical_to_cpu"] is True and r["payload_bytes"] > 0
        for way in ("compress", "decompress"):
            f = r[way]
            assert set(f) >= {"gbps", "bound_gbps", "fraction", "goal_met", "fraction_goal_met", "old_gbps"}
            assert isinstance(f["goal_met"], bool) and isinstance(f["fraction_goal_met"], bool)
            assert f["gbps"] is None or f["gbps"] >= 0


def test_codec_section_on_cpu_tiny() -> None:
    bench = _load()
    doc = bench.codec_section("cpu", {"codec_numel": 5000, "codec_chunk": 1024, "codec_reps": 1})
    assert doc["numel"] == 5000 and doc["chunk"] == 1024 and doc["bound"].startswith("host memcpy")
    _check(doc)
    table = bench.format_table(doc)
    assert max(len(line) for line in table.splitlines()) <= 80
    assert "int8" in table and "ternary" in table


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_codec_section_on_cuda_small() -> None:
    bench = _load()
    doc = bench.codec_section("cuda", {"codec_numel": 1 << 21, "codec_chunk": 1 << 19, "codec_reps": 2})
    assert doc["bound"].startswith("pinned")
    _check(doc)
