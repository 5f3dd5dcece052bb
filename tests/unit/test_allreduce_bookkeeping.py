"""``benchmarks/allreduce.py``'s bookkeeping: a failed round or side is recorded, never a crash; the
hivemind side's matchmaking goes on only when every peer is grouped; the phase medians."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import allreduce  # noqa: E402
import allreduce_hivemind  # noqa: E402
from allreduce_phases import phase_lines, phase_medians  # noqa: E402


def _peer(times: list[float | None], phases: list[Any] | None = None) -> dict[str, Any]:
    return {
        "impl": "swarmtrain", "codec": "none", "numel": 1 << 20, "times": times, "cpu": [0.1] * len(times),
        "bytes_sent": 100, "max_abs_err": 0.0, "group_s": [0.01] * len(times),
        "phases": phases or [], "failed": ["x"] if None in times else [], "retries": 0,
    }  # fmt: skip


def test_a_round_counts_only_when_every_peer_finished_it() -> None:
    row = allreduce._row([_peer([1.0, None, 3.0]), _peer([2.0, 9.0, 1.0])], 2)
    assert row["rounds_measured"] == 2
    assert row["round_s_all"] == [2.0, 3.0]  # the slowest peer's, round 1 left out
    assert row["failed_rounds"] == 1 and row["failure_reasons"] == ["x"]


def test_ratios_skip_a_hivemind_row_without_a_measured_round() -> None:
    hm = allreduce._row([{**_peer([None]), "impl": "hivemind"}], 1)
    ours = allreduce._row([_peer([0.5])], 1)
    rows = [ours, hm]
    allreduce._ratios(rows)
    assert rows[0]["impl"] == "hivemind" and ours["ratio_vs_hivemind_fp32"] is None
    hm2 = allreduce._row([{**_peer([2.0]), "impl": "hivemind"}], 1)
    allreduce._ratios(rows := [ours, hm2])
    assert ours["ratio_vs_hivemind_fp32"] == pytest.approx(0.25)


def test_a_side_that_breaks_off_is_recorded_and_the_run_exits_0(tmp_path: Path, monkeypatch: Any) -> None:
    def fake_run(n: int, cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
        if cfg["impl"] == "hivemind":
            return [], "worker processes [1] died"
        return [allreduce._row([_peer([0.5])], 1)], None

    monkeypatch.setattr(allreduce, "_run", fake_run)
    out = tmp_path / "ar.json"
    assert allreduce.main(["--sizes", "1M", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    died = "worker processes [1] died"
    assert doc["sides"]["hivemind"] == {"rows": 0, "error": died, "retried_after": died}
    assert doc["rows"][0]["ratio_vs_hivemind_fp32"] is None


def test_a_side_that_breaks_off_is_tried_once_more(tmp_path: Path, monkeypatch: Any) -> None:
    calls: list[str] = []

    def fake_run(n: int, cfg: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
        calls.append(cfg["impl"])
        if cfg["impl"] == "hivemind" and calls.count("hivemind") == 1:
            return [], "a DHT process died"
        impl = cfg["impl"]
        return [allreduce._row([{**_peer([0.5 if impl == "swarmtrain" else 1.0]), "impl": impl}], 1)], None

    monkeypatch.setattr(allreduce, "_run", fake_run)
    out = tmp_path / "ar.json"
    assert allreduce.main(["--sizes", "1M", "--codecs", "none", "--json", str(out)]) == 0
    assert calls == ["hivemind", "hivemind", "swarmtrain"]
    doc = json.loads(out.read_text())
    assert doc["sides"]["hivemind"] == {"rows": 1, "error": None, "retried_after": "a DHT process died"}
    assert [r["ratio_vs_hivemind_fp32"] for r in doc["rows"]] == [1.0, 0.5]


def test_nothing_measured_is_one_line_and_exit_1(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.setattr(allreduce, "_run", lambda n, cfg: ([], "no report from the peers in time"))
    assert allreduce.main(["--sizes", "1M", "--json", str(tmp_path / "ar.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    # progress lines say each side is tried once more; the failure itself is the one last line
    assert err[:-1] == [f"{side} side: one more try after: no report from the peers in time"
                        for side in ("hivemind", "swarmtrain")]  # fmt: skip
    assert "nothing measured" in err[-1] and "in time" in err[-1]
    assert not (tmp_path / "ar.json").exists()


def test_matchmaking_goes_on_only_when_every_peer_is_grouped() -> None:
    """One peer without a group makes every peer retry (before the vote, the grouped peers waited at
    the barrier while the other one matchmade alone: the run died)."""
    votes, barrier, got = [0, 0, 0], threading.Barrier(3), [None, None, None]

    def peer(rank: int, ok: bool) -> None:
        got[rank] = allreduce_hivemind._all_grouped(ok, rank, votes, barrier)

    threads = [threading.Thread(target=peer, args=(r, r != 2)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == [False, False, False]
    threads = [threading.Thread(target=peer, args=(r, True)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert got == [True, True, True]


def test_phase_medians_and_lines() -> None:
    s = {
        "wall": {"group": 0.1, "exchange": 0.5, "exchange.wait": 0.3},
        "cpu": {"group": 0.01, "exchange": 0.2, "exchange.wait": 0.0},
        "parts": {"caller_thread": 0.2, "loop_thread": 0.3, "other_threads": 0.0, "p2pd": 0.4,
                  "dht_process": 0.1},
        "admission": {"admission_calls": 0.0, "admission_wall_s": 0.0},
    }  # fmt: skip
    s2 = {**s, "wall": {**s["wall"], "group": 0.3}}
    med = phase_medians([s, s2])
    assert list(med["wall_s"]) == ["group", "exchange", "exchange.wait"]
    assert med["wall_s"]["group"] == pytest.approx(0.2) and med["cpu_s_by_part"]["p2pd"] == 0.4
    lines = phase_lines([{"codec": "int8", "numel": 1 << 22, "phases": med}])
    assert "group=0.200/0.010" in lines[0] and "p2pd=0.400" in lines[1]
