"""``swarmtrain simulate`` rejects bad strategy options in one line, before any peer process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmtrain.app.cli import run


def _one_error_line(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("swarmtrain: error: ")
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--strategy", "nosuch"], ("unknown strategy 'nosuch'", "streaming_diloco", "demo")),
        (["--strategy", "streaming_diloco", "--inner-steps", "2"], ("fragments (4)", "inner_steps (2)")),
        (["--strategy", "diloco", "--inner-steps", "0"], ("inner-steps",)),
        (["--strategy", "streaming_diloco", "--compressor", "nosuchcodec"], ("nosuchcodec",)),
    ],
)
def test_bad_flags_fail_in_one_line(
    argv: list[str], needles: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["simulate", "--steps", "1", *argv]) == 2
    _one_error_line(capsys, *needles)


@pytest.mark.parametrize(
    ("toml", "needles"),
    [
        # the command's default H (30) applies, so 30 // 4 = 7 steps between fragment syncs
        ("[strategy]\nfragments = 4\noverlap = 8\n", ("overlap (8)", "in flight")),
        ("[strategy]\nmixing = 1.5\n", ("mixing",)),
        ("[strategy]\nfragments = 0\n", ("fragments",)),
        ("[strategy]\nnosuch_option = 1\n", ("nosuch_option",)),
    ],
)
def test_bad_streaming_options_in_a_config_file(
    toml: str, needles: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.toml"
    path.write_text(toml)
    argv = ["simulate", "--strategy", "streaming_diloco", "--steps", "1", "--config", str(path)]
    assert run(argv) == 2
    _one_error_line(capsys, *needles)


def test_bad_demo_options_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWARMTRAIN_STRATEGY__DEMO_CHUNK", "2")
    monkeypatch.setenv("SWARMTRAIN_STRATEGY__DEMO_TOPK", "5")
    assert run(["simulate", "--strategy", "demo", "--steps", "1"]) == 2
    _one_error_line(capsys, "demo_topk (5)", "2x2")
    monkeypatch.setenv("SWARMTRAIN_STRATEGY__DEMO_TOPK", "2")
    monkeypatch.setenv("SWARMTRAIN_STRATEGY__DEMO_VALUES", '"int3"')
    assert run(["simulate", "--strategy", "demo", "--steps", "1"]) == 2
    _one_error_line(capsys, "demo_values")
