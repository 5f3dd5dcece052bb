"""``--chaos SPEC``: the parser (rates, delays, errors in one line) and the fault schedule."""

from __future__ import annotations

import pytest

from swarmtrain.core.errors import ConfigError
from swarmtrain.simulation.chaos import ChaosSchedule, ChaosSpec, parse_chaos


def test_parses_rates_delays_and_seed() -> None:
    s = parse_chaos("kill=2/min, preempt=1/min,restart=20s,seed=7")
    assert s.kill_per_s == pytest.approx(2 / 60) and s.preempt_per_s == pytest.approx(1 / 60)
    assert s.restart_s == 20.0 and s.seed == 7
    assert parse_chaos("kill=1/s").restart_s is None
    assert parse_chaos("preempt=30/h,restart=500ms").restart_s == pytest.approx(0.5)
    assert parse_chaos("kill=0.5/min,restart=1m").restart_s == 60.0
    assert parse_chaos("KILL=3/MIN,restart=15").restart_s == 15.0
    assert "2 kills/min" in parse_chaos("kill=2/min,restart=15s").describe()


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("kill=2/fortnight", "rate"),
        ("kill=two/min", "rate"),
        ("kill=-1/min", "rate"),
        ("kill=2/min,restart=soon", "delay"),
        ("kill=2/min,restart=-3s", "delay"),
        ("kill=2/min,explode=1/min", "unknown key"),
        ("kill", "key=value"),
        ("kill=", "key=value"),
        ("kill=1/min,kill=2/min", "twice"),
        ("restart=15s", "kill or preempt"),
        ("kill=0/min", "kill or preempt"),
        ("", "kill or preempt"),
        ("kill=1/min,seed=x", "integer"),
    ],
)
def test_bad_specs_fail_in_one_line(spec: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_chaos(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_cli_refuses_a_bad_spec_with_exit_2_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    from swarmtrain.app.cli import run

    assert run(["simulate", "-n", "3", "--steps", "1", "--chaos", "kill=lots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("swarmtrain: error: --chaos kill=lots") and "\n" not in err, err


def test_schedule_brings_one_fault_per_period_at_random_moments() -> None:
    spec = ChaosSpec(kill_per_s=2 / 60, preempt_per_s=1 / 60, restart_s=15.0)
    sched = ChaosSchedule(spec, seed=1)
    assert not sched.started and sched.due(1e9) == []
    sched.start(100.0)
    kills: list[float] = []
    preempts: list[float] = []
    t = 100.0
    while t < 100.0 + 600.0:  # ten minutes, looked at every 0.5 s
        for kind in sched.due(t):
            (kills if kind == "kill" else preempts).append(t)
        t += 0.5
    assert len(kills) in (19, 20, 21) and len(preempts) in (9, 10, 11)
    for k, at in enumerate(kills[:-1]):  # the k-th in its own 30 s period
        assert 100.0 + 30 * k <= at <= 100.0 + 30 * (k + 1) + 0.5
    gaps = {round(b - a) for a, b in zip(kills, kills[1:], strict=False)}
    assert len(gaps) > 3  # random moments, not a fixed beat


def test_schedule_is_reproducible_from_its_seed() -> None:
    spec = parse_chaos("kill=6/min,seed=3")

    def moments() -> list[float]:
        sched = ChaosSchedule(spec, seed=99)  # the spec's seed wins over the run's
        sched.start(0.0)
        return [t / 10 for t in range(0, 1200) if sched.due(t / 10)]

    assert moments() == moments()
    assert ChaosSchedule(spec, seed=0).pick([5, 1, 3]) in (1, 3, 5)
