"""``simulate --strategy swarm``: bad flags are one line and exit 2, before any process starts."""

from __future__ import annotations

import pytest

from swarmtrain.app.cli import run
from swarmtrain.simulation.swarm import spread_servers


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--stages", "2"], "need --strategy swarm"),
        (["--strategy", "swarm", "--chaos", "kill=1/min", "--kill-servers", "1"], "give one"),
        (["--strategy", "swarm", "--inner-steps", "5"], "--inner-steps does not apply"),
        (["--strategy", "swarm", "--peers", "3", "--kill-servers", "2"], "--kill-servers 2"),
        (["--strategy", "swarm", "--peers", "1"], "cannot serve 2 stages"),
        (["--strategy", "swarm", "--stages", "9"], "exceeds the model's 4 blocks"),
        (["--strategy", "swarm", "--activation-codec", "nope"], "swarm.codec: "),
        (["--activation-codec", "int8"], "need --strategy swarm"),
        (
            ["--strategy", "swarm", "--compressor", "int8"],
            "--compressor does not apply to --strategy swarm (the codec between stages is "
            "--activation-codec)",
        ),
        (["--strategy", "swarm", "--no-owner-check"], "--owner-check does not apply"),
        (["--strategy", "swarm", "--intruders", "1"], "--intruders does not apply"),
    ],
)
def test_bad_swarm_flags_are_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["simulate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("swarmtrain: error:") and needle in err, err


def test_servers_spread_round_robin() -> None:
    assert spread_servers(5, 2) == [0, 1, 0, 1, 0]
    assert [spread_servers(7, 3).count(s) for s in range(3)] == [3, 2, 2]
