"""The effects an intruder run reports (``swarmtrain.simulation.intrusion``): a late round after which
the honest peer adopted the committed state is not a failed round (a loaded machine makes peers late
in the attacked run, which has four more processes than the clean one); a round that failed is."""

from __future__ import annotations

from dataclasses import replace

from test_simulation_wait import _outcome, _result

from swarmtrain.simulation.intrusion import intrusion_summary


def test_late_rounds_caught_up_are_reported_apart_from_failed_rounds() -> None:
    clean = _result([_outcome(0, 0.0, 4, 1), replace(_outcome(1, 0.0, 4, 1), late_rounds=1)])
    late = _result([replace(_outcome(0, 0.0, 4, 2), late_rounds=2), _outcome(1, 0.0, 4, 1)])
    out = intrusion_summary(late, clean)
    assert out["intruder_effects"]["rounds_failed"] == 0
    assert out["rounds_late"] == 1  # two late rounds against the clean run's one
    failed = _result([replace(_outcome(0, 0.0, 4, 2), late_rounds=1), _outcome(1, 0.0, 4, 1)])  # one not late
    assert intrusion_summary(failed, clean)["intruder_effects"]["rounds_failed"] == 1
