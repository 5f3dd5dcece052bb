"""The benchmarks' run series: ``--append`` logic (``benchmarks/runlog.py``), the summaries
``docs/benchmarks.md`` quotes, and the shape of the recorded ``benchmarks/results/*_runs.json`` files.

No benchmark runs here: the inputs are synthetic payloads or the stored files.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = BENCH / "results"


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[f"bench_{name}"] = mod
    spec.loader.exec_module(mod)
    return mod


runlog = _load("runlog")

RECORD = {"utc": "2026-12-01T00:00:00Z", "loadavg": [0.5, 0.4, 0.3], "git_commit": "abc", "git_dirty": False}


def test_append_creates_the_series_then_extends_it(tmp_path: Path) -> None:
    path = tmp_path / "x_runs.json"
    first = runlog.append_run(path, "x", {"value": 1.0}, note="a note", record=RECORD)
    second = runlog.append_run(path, "x", {"value": 2.0, "run": 99, "recorded": "ignored"}, record=RECORD)
    data = json.loads(path.read_text())
    assert data["benchmark"] == "x" and data["note"] == "a note"
    assert [r["run"] for r in data["runs"]] == [1, 2]
    assert first["run"] == 1 and second["run"] == 2
    assert data["runs"][1]["value"] == 2.0 and data["runs"][1]["recorded"] == RECORD
    assert not (tmp_path / "x_runs.json.tmp").exists()


def test_append_continues_after_the_highest_run_number(tmp_path: Path) -> None:
    path = tmp_path / "x_runs.json"
    path.write_text(json.dumps({"benchmark": "x", "note": "", "runs": [{"run": 7, "recorded": RECORD}]}))
    assert runlog.append_run(path, "x", {}, record=RECORD)["run"] == 8


def test_append_refuses_another_benchmarks_series(tmp_path: Path) -> None:
    path = tmp_path / "x_runs.json"
    runlog.append_run(path, "x", {}, record=RECORD)
    with pytest.raises(ValueError, match="not 'y'"):
        runlog.append_run(path, "y", {}, record=RECORD)
    path.write_text(json.dumps({"benchmark": "x", "rows": []}))
    with pytest.raises(ValueError, match="not a run series"):
        runlog.load_runs(path, "x")


def test_recorded_names_when_load_commit_and_command() -> None:
    rec = runlog.recorded(["benchmarks/x.py", "--append"])
    assert set(rec) == {"utc", "loadavg", "git_commit", "git_dirty", "command"}
    assert rec["utc"].endswith("Z") and rec["command"] == "python benchmarks/x.py --append"
    assert rec["loadavg"] is None or len(rec["loadavg"]) == 3


def _allreduce_run(run: int, ratio4: float, ratio16: float) -> dict[str, Any]:
    def row(impl: str, codec: str, numel: int, round_s: float, ratio: float) -> dict[str, Any]:
        return {
            "impl": impl,
            "codec": codec,
            "numel": numel,
            "round_s_median": round_s,
            "data_phase_s_median": round_s * 0.9,
            "ratio_vs_hivemind_fp32": ratio,
            "data_ratio_vs_hivemind_fp32": ratio * 0.9,
            "cpu_s_all_peers_median": 1.0,
        }

    return {
        "run": run,
        "loadavg_before": [1.0 + run, 0, 0],
        "loadavg_after": [2.0 + run, 0, 0],
        "rows": [
            row("hivemind", "none", 4 << 20, 0.4, 1.0),
            row("swarmtrain", "none", 4 << 20, 0.4 * ratio4, ratio4),
            row("swarmtrain", "none", 16 << 20, 1.3 * ratio16, ratio16),
        ],
    }


def test_allreduce_summary_spans_every_run() -> None:
    allreduce = _load("allreduce")
    s = allreduce.series_summary([_allreduce_run(1, 0.6, 0.65), _allreduce_run(2, 0.7, 0.62)])
    assert s["runs"] == 2 and s["run_numbers"] == [1, 2]
    assert s["ranges"]["swarmtrain none 4M"]["ratio_vs_hivemind_fp32"] == [0.6, 0.7]
    assert s["ranges"]["swarmtrain none 16M"]["ratio_vs_hivemind_fp32"] == [0.62, 0.65]
    assert s["loadavg_1min_range"] == [2.0, 4.0]
    assert "0.60-0.70" in allreduce.format_summary(s)


def test_codecs_entry_and_summary(tmp_path: Path) -> None:
    codecs = _load("codecs")

    def res(codec: str, roof: float, copy: float) -> dict[str, Any]:
        return {
            "codec": codec,
            "compress_roofline": roof,
            "compress_gbps": 10 * roof,
            "copy_rw_gbps": copy,
            "encoder": "native",
        }

    doc = {
        "created_utc": "t",
        "steady_state": True,
        "numel": 8,
        "results": [res("int8", 0.97, 30.0), res("ternary", 0.8, 35.0)],
    }
    entry = codecs.run_entry(doc, 3, 0.5, 0.7)
    assert entry["int8_compress_roofline"] == 0.97 and entry["ternary_encoder"] == "native"
    assert (entry["copy_rw_gbps_min"], entry["copy_rw_gbps_max"]) == (30.0, 35.0)
    path = tmp_path / "codecs_cpu_runs.json"
    runlog.append_run(path, "codecs", entry, record=RECORD)
    runlog.append_run(path, "codecs", {**entry, "int8_compress_roofline": 0.99}, record=RECORD)
    out = codecs.write_summaries(path, ["1-2", "2"])
    assert out["1-2"]["ranges"]["int8_compress_roofline"] == [0.97, 0.99]
    assert out["2-2"]["runs"] == [2]
    assert "summaries" in json.loads(path.read_text())
    with pytest.raises(ValueError):
        codecs.summarize(runlog.load_runs(path, "codecs")["runs"], 5, 6)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*_runs.json")), ids=lambda p: p.name)
def test_recorded_series_have_the_shape_the_scripts_write(path: Path) -> None:
    data = json.loads(path.read_text())
    series = runlog.load_runs(path, data.get("benchmark", "?"))
    numbers = [r["run"] for r in series["runs"]]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers) and numbers[0] >= 1
    for r in series["runs"]:
        assert {"utc", "loadavg", "git_commit", "command"} <= set(r["recorded"]), (path.name, r["run"])


def test_byzantine_readme_table_comes_from_the_grid() -> None:
    byz = _load("byzantine")
    rows = []
    for strategy, clean in (("diloco", 3.0), ("data_parallel", 2.0)):
        rows.append(
            {
                "strategy": strategy,
                "n": 16,
                "f": 0,
                "attack": "none",
                "reducer": "mean",
                "loss": clean,
                "ratio": 1.0,
                "status": "ok",
            }
        )
        rows.append(
            {
                "strategy": strategy,
                "n": 16,
                "f": 7,
                "attack": "sign_flip",
                "reducer": "mean",
                "loss": 9.0,
                "ratio": 9.0 / clean,
                "status": "ok",
            }
        )
        rows.append(
            {
                "strategy": strategy,
                "n": 16,
                "f": 7,
                "attack": "sign_flip",
                "reducer": "centered_clip",
                "loss": clean,
                "ratio": None,
                "status": "diverged",
            }
        )
    table = byz.readme_table({"grid": rows})
    assert "| sign flip (x4) | 3.00 | diverged | 4.50 | diverged |" in table
    assert "| stale | - | - | - | - |" in table
    assert "DiLoCo 3.000, DataParallel 2.000" in table
    assert "not re-measured" in byz.readme_table({"grid": rows}, n=8)


def test_attacked_reducer_forges_attacker_rows_and_owner_partitions() -> None:
    import torch

    from peers.reducers import build_reducer
    from swarmtrain.simulation.attacks import build_attack

    sim = _load("byzantine_sim")
    stack = torch.ones(4, 8)
    w = torch.ones(4)
    flip = sim.AttackedReducer(build_reducer("mean"), 4, {0: build_attack("sign_flip", scale=4.0)}, 1)
    assert torch.allclose(flip.reduce(stack, w), torch.full((8,), (3 - 4) / 4))
    owner = sim.AttackedReducer(build_reducer("mean"), 4, {1: build_attack("malicious_owner")}, 1)
    out = owner.reduce(stack, w)  # peer 1 owns elements 2..3 and returns them negated
    assert out.tolist() == [1, 1, -1, -1, 1, 1, 1, 1]
    # stale keeps one memory per tensor slot: two tensors alternate, each replays its own past
    stale = sim.AttackedReducer(build_reducer("mean"), 2, {0: build_attack("stale", delay=1)}, 2)
    a, b = torch.zeros(2, 3), torch.full((2, 3), 10.0)
    stale.reduce(a, torch.ones(2)), stale.reduce(b, torch.ones(2))
    assert stale.reduce(a + 1, torch.ones(2)).tolist() == [0.5, 0.5, 0.5]  # attacker replays a's 0
    assert stale.reduce(b + 1, torch.ones(2)).tolist() == [10.5, 10.5, 10.5]  # and b's 10


@pytest.mark.parametrize("strategy", ["data_parallel", "diloco"])
def test_byzantine_sim_runs_the_real_strategies(strategy: str) -> None:
    from peers.reducers import build_reducer

    sim = _load("byzantine_sim")
    corpus = sim.load_corpus(1 << 16)
    kw = {"rounds": 3} if strategy == "data_parallel" else {"rounds": 2, "inner_steps": 2}
    clean = sim.run_sim(sim.SimConfig(strategy, 4, 0, "none", batch=8, **kw), build_reducer("mean"), corpus)
    bad = sim.run_sim(
        sim.SimConfig(strategy, 4, 1, "sign_flip", batch=8, **kw), build_reducer("mean"), corpus
    )
    assert clean["status"] == bad["status"] == "ok"
    assert clean["params_identical"] and bad["params_identical"]
    assert bad["loss"] > clean["loss"]
