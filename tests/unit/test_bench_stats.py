"""Means, 95 % t-intervals over seeds and goal verdicts of ``swarmtrain bench strategies`` (pure)."""

from __future__ import annotations

import math

import pytest

from swarmtrain.app.bench.stats import goal_verdict, mean_ci95, paired_gaps, t975


def test_t_interval_of_known_values() -> None:
    mean, ci = mean_ci95([1.0, 2.0, 3.0])  # s = 1: 4.303 / sqrt(3)
    assert mean == 2.0 and ci == pytest.approx(4.303 / math.sqrt(3))
    assert mean_ci95([2.5, 2.5])[1] == 0.0
    assert t975(1) == 12.706 and t975(30) == 2.042 and t975(200) == 1.96


def test_one_seed_has_no_interval_and_no_values_is_an_error() -> None:
    assert mean_ci95([2.75]) == (2.75, None)
    with pytest.raises(ValueError):
        mean_ci95([])
    with pytest.raises(ValueError):
        t975(0)


def test_a_diverged_seed_is_not_averaged_away() -> None:
    mean, ci = mean_ci95([2.0, float("nan"), 2.1])
    assert math.isnan(mean) and ci is not None and math.isnan(ci)


def test_gaps_are_paired_by_seed() -> None:
    assert paired_gaps([2.2, 3.3], [2.0, 3.0]) == pytest.approx([0.1, 0.1])
    with pytest.raises(ValueError):
        paired_gaps([1.0], [1.0, 2.0])


@pytest.mark.parametrize(
    ("mean", "ci", "limit", "at_most", "verdict"),
    [
        (0.015, 0.004, 0.02, True, "met"),  # [1.1 %, 1.9 %] inside <= 2 %
        (0.0208, 0.003, 0.02, True, "unclear"),  # straddles: "+2.08 % vs the 2 % goal"
        (0.018, 0.003, 0.02, True, "unclear"),  # the mean is inside, the interval is not
        (0.03, 0.004, 0.02, True, "not met"),
        (0.019, None, 0.02, True, "met (1 seed)"),
        (452.0, 10.0, 400.0, False, "met"),  # a reduction: at least
        (405.0, 10.0, 400.0, False, "unclear"),
        (float("nan"), 0.1, 0.02, True, "not met"),
    ],
)
def test_met_only_when_the_whole_interval_is_inside_the_goal(
    mean: float, ci: float | None, limit: float, at_most: bool, verdict: str
) -> None:
    assert goal_verdict(mean, ci, limit, at_most=at_most) == verdict


def test_the_long_runs_goals_are_met_only_inside_the_interval() -> None:
    """``benchmarks/long_run.py``: a DiLoCo mean inside 2 % whose interval is not is no "met"."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from long_run import goal_lines, goals

    def row(label: str, strategy: str, gap: float, ci: float | None, red: float, peak: int = 100) -> dict:  # type: ignore[type-arg]
        return {
            "label": label,
            "strategy": strategy,
            "gap_vs_dp": gap,
            "gap_vs_dp_ci95": ci,
            "reduction_vs_dp": red,
            "final_val_loss": 2.0 * (1 + gap),
            "peak_sync_bytes": peak,
        }

    rows = [
        row("diloco int4", "diloco", 0.015, 0.01, 500.0),
        row("streaming_diloco int4", "streaming_diloco", 0.016, 0.01, 500.0, peak=20),
        row("demo", "demo", 0.03, 0.005, 150.0),
    ]
    out = goals(rows, fragments=4)
    assert [g.get("verdict") for g in out[:2]] == ["unclear", "met"]
    assert [g["met"] for g in out[:2]] == [False, True]
    assert goal_lines(out)[0].startswith("- **unclear**: DiLoCo within 2 %")
    rows[0]["gap_vs_dp_ci95"] = None  # one seed: judged on the mean, and said so
    assert goals(rows, fragments=4)[0]["verdict"] == "met (1 seed)"


def test_streaming_goal_is_judged_on_the_paired_per_seed_interval() -> None:
    """``benchmarks/long_run.py``: Streaming DiLoCo within 1 % of DiLoCo, seed against seed."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from long_run import goals

    def row(label: str, strategy: str, losses: list[float], peak: int) -> dict:  # type: ignore[type-arg]
        return {
            "label": label,
            "strategy": strategy,
            "gap_vs_dp": 0.01,
            "gap_vs_dp_ci95": 0.001,
            "reduction_vs_dp": 500.0,
            "final_val_loss": sum(losses) / len(losses),
            "val_losses": losses,
            "data_seeds": [0, 1, 2],
            "peak_sync_bytes": peak,
        }

    diloco = row("diloco int4", "diloco", [2.0, 2.4, 1.8], 100)
    # each seed 0.5 % above its DiLoCo seed: met, although the means' spread is wide
    stream = row("streaming_diloco int4", "streaming_diloco", [2.01, 2.412, 1.809], 20)
    demo = row("demo", "demo", [2.1, 2.1, 2.1], 100)
    out = goals([diloco, stream, demo], fragments=4)[2]
    assert out["verdict"] == "met" and out["met"] and "±" in out["measured"]
    stream["val_losses"] = [2.01, 2.5, 1.7]  # the same mean gap, but not each seed: unclear
    out = goals([diloco, stream, demo], fragments=4)[2]
    assert out["verdict"] == "unclear" and not out["met"]
