"""Config loading: precedence defaults < file < env < CLI (< nothing), validation errors as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmtrain.core.config import Config, load_config
from swarmtrain.core.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.toml"
    p.write_text(text, encoding="utf-8")
    return p


def test_defaults_without_sources() -> None:
    cfg = load_config(env={})
    assert cfg == Config()
    assert cfg.model.preset == "tiny" and cfg.strategy.name == "local"


def test_precedence_file_env_cli(tmp_path: Path) -> None:
    path = _write(tmp_path, "[train]\nlr = 0.01\nbatch_size = 4\nsteps = 7\n[model]\npreset = 'small'\n")
    env = {"SWARMTRAIN_TRAIN__LR": "0.02", "SWARMTRAIN_TRAIN__BATCH_SIZE": "8", "HOME": "/x"}
    cfg = load_config(path, {"train.lr": 0.03, "train.seed": None}, env=env)
    assert cfg.train.lr == 0.03  # CLI beats env beats file
    assert cfg.train.batch_size == 8  # env beats file
    assert cfg.train.steps == 7  # file beats default
    assert cfg.model.preset == "small"
    assert cfg.train.seed == 0  # a None override means "flag not given"


def test_base_layer_is_lowest(tmp_path: Path) -> None:
    base = Config(train={"lr": 0.5, "steps": 11, "batch_size": 3}).model_dump(mode="json")  # type: ignore[arg-type]
    path = _write(tmp_path, "[train]\nsteps = 12\n")
    cfg = load_config(path, {"train.batch_size": 5}, env={}, base=base)
    assert (cfg.train.lr, cfg.train.steps, cfg.train.batch_size) == (0.5, 12, 5)


def test_env_values_parse_as_toml() -> None:
    env = {
        "SWARMTRAIN_DATA__PATHS": '["a.txt", "b"]',
        "SWARMTRAIN_TRAIN__COMPILE": "true",
        "SWARMTRAIN_TRAIN__DEVICE": "cpu",
    }
    cfg = load_config(env=env)
    assert cfg.data.paths == ["a.txt", "b"] and cfg.train.compile is True and cfg.train.device == "cpu"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"overrides": {"train.lr": -1.0}}, "train.lr"),
        ({"overrides": {"train.batch_size": 0}}, "train.batch_size"),
        ({"overrides": {"model.preset": "huge"}}, "model.preset"),
        ({"overrides": {"train.nope": 1}}, "train.nope"),
        ({"overrides": {"lr": 1}}, "section.field"),
        ({"env": {"SWARMTRAIN_LR": "1"}}, "SWARMTRAIN_LR"),
        ({"env": {"SWARMTRAIN_TRAIN__STEPS": "many"}}, "train.steps"),
    ],
)
def test_bad_values_name_the_field(kwargs: dict, needle: str) -> None:
    kwargs.setdefault("env", {})
    with pytest.raises(ConfigError) as ei:
        load_config(**kwargs)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(_write(tmp_path, "[train\nlr=1"), env={})
    with pytest.raises(ConfigError, match="modle"):
        load_config(_write(tmp_path, "[modle]\npreset='tiny'\n"), env={})
    with pytest.raises(ConfigError, match="train.lr"):
        load_config(_write(tmp_path, "[train]\nlr = 'fast'\n"), env={})


def test_model_overrides_validated() -> None:
    with pytest.raises(ConfigError, match="model.n_layer"):
        load_config(None, {"model.n_layer": 0}, env={})


def test_a_key_that_moved_section_is_one_line_naming_its_new_place(tmp_path: Path) -> None:
    toml = tmp_path / "old.toml"
    toml.write_text("[peers]\nattack = 'sign_flip'\n")
    with pytest.raises(ConfigError, match=r"^peers.attack has moved: write it as simulation.attack$"):
        load_config(toml, env={})
    cfg = load_config(None, {"simulation.attack": "sign_flip"}, env={})
    assert cfg.simulation.attack == "sign_flip"


def test_an_old_checkpoint_config_with_moved_keys_loads_them_in_their_new_place() -> None:
    """A checkpoint saved before the move dumps every field, defaults included: resuming it must
    not fail on keys the user never wrote."""
    saved = Config().model_dump()
    saved.pop("simulation")
    saved["peers"].update(attack="sign_flip", attackers=1, attack_options={}, malicious_owners=0)
    cfg = load_config(None, {"train.lr": 1e-3}, env={}, base=saved)
    assert cfg.simulation.attack == "sign_flip" and cfg.simulation.attackers == 1


# --- data.source follows data.paths (issue 17: paths without source trained on the stdlib) ---


@pytest.mark.parametrize(
    ("paths", "source"),
    [(["notes.txt"], "text"), (["a.bin", "val.bin"], "bin"), (["corpus/"], "text"), ([], "stdlib")],
)
def test_data_source_inferred_from_paths(tmp_path: Path, paths: list[str], source: str) -> None:
    body = "[data]\npaths = [" + ", ".join(repr(p) for p in paths) + "]\n"
    assert load_config(_write(tmp_path, body), env={}).data.source == source


def test_data_source_bin_for_a_token_folder(tmp_path: Path) -> None:
    (tmp_path / "owt").mkdir()
    (tmp_path / "owt" / "train.bin").write_bytes(b"\0\0")
    assert load_config(overrides={"data.paths": [str(tmp_path / "owt")]}, env={}).data.source == "bin"


def test_data_source_explicit_wins_and_assignment_infers() -> None:
    explicit = {"data.paths": ["x.bin"], "data.source": "text"}
    assert load_config(overrides=explicit, env={}).data.source == "text"
    cfg = load_config(env={})
    cfg.data.paths = ["x.bin"]  # source never given: follows the new paths
    assert cfg.data.source == "bin"


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"data.paths": ["a.bin", "b.txt"]}, "data: cannot mix .bin token files with text files"),
        ({"data.paths": ["a.txt"], "data.source": "stdlib"}, "data: paths given but source is stdlib"),
    ],
)
def test_data_source_conflicts_are_one_line(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=data, env={})
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_data_paths_over_a_lower_source_reinfer(tmp_path: Path) -> None:
    """A checkpoint's saved source described its own paths; new paths above it pick their own."""
    base = Config().model_dump(mode="json")  # source = "stdlib", written out
    cfg = load_config(_write(tmp_path, "[data]\npaths = ['mine.txt']\n"), env={}, base=base)
    assert cfg.data.source == "text"
    base = Config(data={"paths": ["old.txt"]}).model_dump(mode="json")  # type: ignore[arg-type]
    assert load_config(overrides={"data.paths": ["new.bin"]}, env={}, base=base).data.source == "bin"
    assert load_config(env={}, base=base).data == Config(data={"paths": ["old.txt"]}).data  # type: ignore[arg-type]


def _switches_read_by_the_code() -> set[str]:
    """``SWARMTRAIN_*`` names that are not ``SECTION__FIELD``, as the library and its scripts spell them."""
    import re

    root = Path(__file__).resolve().parents[2]
    names: set[str] = set()
    for top in ("swarmtrain", "peers", "compression", "optimizers", "benchmarks", "examples"):
        for path in (root / top).rglob("*.py"):
            names.update(re.findall(r"\bSWARMTRAIN_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(encoding="utf-8")))
    return {n for n in names if "__" not in n and n != "SWARMTRAIN_LR"}  # (SWARMTRAIN_LR: a typo example)


def test_every_switch_the_code_reads_is_accepted_by_load_config() -> None:
    # a documented switch (SWARMTRAIN_KEEP_HEAP=0, SWARMTRAIN_NATIVE_CODECS=0) must not make every
    # command refuse its environment as an unknown config field
    switches = _switches_read_by_the_code()
    assert {"SWARMTRAIN_KEEP_HEAP", "SWARMTRAIN_NATIVE_CODECS", "SWARMTRAIN_PEER_MARKER"} <= switches
    cfg = load_config(env={name: "0" for name in switches})
    assert cfg == Config()
