"""Issue 32.2: the curves against a modelled wall-clock over an emulated link (``--link``).

The model (``swarmtrain.app.bench.link``) is arithmetic on measured figures, not a measurement:
compute per step from the run's wall time, one RTT per sync, the bytes sent over the bandwidth.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swarmtrain.app.bench.link import Link, modelled_times, parse_link
from swarmtrain.app.bench.outputs import write_outputs
from swarmtrain.core.errors import ConfigError


def test_parse_link_reads_bandwidth_and_rtt_with_units() -> None:
    assert parse_link("100mbit,50ms") == Link(1e8, 0.05)
    assert parse_link(" 1.5gbit , 0.2s ") == Link(1.5e9, 0.2)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("100mbit", "BANDWIDTH,RTT"),
        ("100,50ms", "needs a unit"),
        ("100mb,50ms", "needs a unit"),
        ("0mbit,5ms", "above 0"),
        ("100mbit,50", "RTT"),
    ],
)
def test_bad_link_is_one_line(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_link(text)
    assert says in str(err.value) and "\n" not in str(err.value)


def _row(wall_s: float, rounds: float, curve: list[tuple[int, float]]) -> dict:
    return {
        "label": "p",
        "wall_s": wall_s,
        "rounds_committed": rounds,
        "bytes_per_token": 1.0,
        "final_val_loss": 2.0,
        "val_loss_ci95": None,
        "curve": [
            {"step": s, "tokens": s, "bytes": b, "val_loss": 3.0 - s / 100, "val_loss_ci95": None}
            for s, b in curve
        ],
    }


def test_modelled_time_is_compute_plus_rtt_per_sync_plus_bytes_over_bandwidth() -> None:
    # 150 steps in 30 s, 5 syncs (H=30): at step 60, 12 s of compute, 2 syncs, 2 MB sent
    row = _row(30.0, 5.0, [(60, 2e6), (150, 5e6)])
    t60, t150 = modelled_times(row, 150, Link(1e8, 0.05))
    assert t60 == pytest.approx(12.0 + 2 * 0.05 + 2e6 * 8 / 1e8)
    assert t150 == pytest.approx(30.0 + 5 * 0.05 + 5e6 * 8 / 1e8)
    # a slower link only adds communication time
    assert modelled_times(row, 150, Link(1e6, 0.05))[1] == pytest.approx(30.25 + 40.0)


def test_write_outputs_with_a_link_records_times_and_plots_them(tmp_path: Path) -> None:
    rows = [_row(30.0, 150.0, [(60, 4e7), (150, 1e8)]), _row(20.0, 5.0, [(60, 2e5), (150, 5e5)])]
    meta = {
        "workers": 2,
        "steps": 150,
        "batch_size": 4,
        "preset": "tiny",
        "seeds": 1,
        "link": Link(1e8, 0.05).as_json(),
    }
    written = write_outputs(rows, meta, tmp_path / "g.json")
    assert written[-1].name == "g_wallclock.png" and written[-1].read_bytes()[:4] == b"\x89PNG"
    doc = json.loads((tmp_path / "g.json").read_text(encoding="utf-8"))
    assert "not measured" in doc["settings"]["link"]["note"]
    times = [c["modelled_wall_s"] for c in doc["rows"][0]["curve"]]
    assert times == pytest.approx([12.0 + 60 * 0.05 + 3.2, 30.0 + 150 * 0.05 + 8.0])
    plain = write_outputs(rows, {k: v for k, v in meta.items() if k != "link"}, tmp_path / "h.json")
    assert not any(p.name.endswith("_wallclock.png") for p in plain)
