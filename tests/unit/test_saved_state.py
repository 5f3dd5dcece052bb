"""A volunteer's own saved state (``swarmtrain.app.peer.saved_state``): written atomically as one file next to
its identity, read back bit-exactly, and ignored with one warning when it is corrupt, of another run or
not ours; ``adopt_saved_state`` loads it only when it is the freshest state the donors vouch for.

The donors' announcements are a DHT read; here ``freshest_vouched`` is replaced by its answer (the
real read is covered by tests/integration/test_rejoin.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from swarmtrain.app.peer.saved_state import read_saved_state, save_state, saved_state_path
from swarmtrain.app.peer.state import adopt_saved_state, shared_digest, state_snapshot
from swarmtrain.app.train.trainer import Trainer
from swarmtrain.core.config import Config, load_config

RUN = "saved-run"


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _cfg(tmp_path: Path, **over: Any) -> Config:
    base = {
        "model.n_layer": 1,
        "model.n_head": 2,
        "model.n_embd": 32,
        "model.block_size": 32,
        "data.max_bytes": 200_000,
        "train.batch_size": 4,
        "train.steps": 3,
        "train.device": "cpu",
        "train.progress": False,
        "train.eval_interval": 1000,
        "train.out_dir": str(tmp_path / "run"),
    }
    base.update(over)
    return load_config(overrides=base, env={})


class _Collective:
    banned: frozenset[str] = frozenset()
    round_id = 0


def _saved(tmp_path: Path) -> tuple[Trainer, Path]:
    """A trainer after a few steps whose state is saved as round 4."""
    donor = Trainer(_cfg(tmp_path))
    donor.fit()
    path = saved_state_path(tmp_path / "key")
    assert path is not None
    tensors, meta = state_snapshot(donor, 4)
    assert save_state(path, dict(tensors), meta, run_id=RUN, digest=shared_digest(donor))
    return donor, path


def test_path_sits_next_to_the_identity_and_none_without_one(tmp_path: Path) -> None:
    assert saved_state_path(None) is None
    assert saved_state_path(tmp_path / "me.key") == tmp_path / "me.key.state.safetensors"


def test_saved_state_reads_back_and_is_one_file(tmp_path: Path) -> None:
    donor, path = _saved(tmp_path)
    tensors, meta = state_snapshot(donor, 4)
    save_state(path, dict(tensors), meta, run_id=RUN, digest=shared_digest(donor))  # replaced, not added
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [path.name]
    saved = read_saved_state(path, RUN)
    assert saved is not None and saved.round == 4 and saved.digest == shared_digest(donor)
    assert saved.tensors.keys() == dict(tensors).keys()
    assert all(torch.equal(saved.tensors[k], v) for k, v in tensors.items())


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "other_run", "not_ours", "bad_digest"])
def test_a_bad_saved_state_is_ignored_with_one_warning(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    from peers.state.state_transfer import serialize_state

    donor, path = _saved(tmp_path)
    tensors, meta = state_snapshot(donor, 4)
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\xff" * 64)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "other_run":
        save_state(path, dict(tensors), meta, run_id="another-run", digest=shared_digest(donor))
    elif damage == "not_ours":
        path.write_bytes(serialize_state(tensors, meta))  # a donor's snapshot, not a saved state
    else:
        save_state(path, dict(tensors), meta, run_id=RUN, digest="zz" * 32)
    with caplog.at_level(logging.WARNING, logger="swarmtrain.app.peer.saved_state"):
        assert read_saved_state(path, RUN) is None
    assert len(caplog.records) == 1 and "ignoring the saved state" in caplog.records[0].getMessage()


def test_no_file_is_silent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert read_saved_state(tmp_path / "nothing.safetensors", RUN) is None
        assert read_saved_state(None, RUN) is None
    assert not caplog.records


def test_an_unwritable_place_is_one_warning_not_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("x")
    with caplog.at_level(logging.WARNING):
        ok = save_state(tmp_path / "file" / "sub" / "s.safetensors", {}, {"round": 1}, run_id=RUN, digest="")
    assert not ok and len(caplog.records) == 1


def _fresh_vouch(monkeypatch: pytest.MonkeyPatch, answer: tuple[int, bytes] | None) -> None:
    import peers.state.state_transfer as st

    monkeypatch.setattr(st, "freshest_vouched", lambda node, **kw: answer)


def test_the_saved_state_loads_when_it_is_the_freshest_vouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    donor, path = _saved(tmp_path)
    saved = read_saved_state(path, RUN)
    assert saved is not None
    _fresh_vouch(monkeypatch, (4, bytes.fromhex(saved.digest)))
    restarted, coll = Trainer(_cfg(tmp_path, **{"train.seed": 7})), _Collective()
    assert shared_digest(restarted) != saved.digest
    assert adopt_saved_state(None, restarted, coll, saved)
    assert shared_digest(restarted) == shared_digest(donor) and restarted.step == donor.step
    assert coll.round_id == 4


@pytest.mark.parametrize("why", ["stale", "none", "other_digest", "tampered"])
def test_the_saved_state_is_not_taken_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    _, path = _saved(tmp_path)
    saved = read_saved_state(path, RUN)
    assert saved is not None
    digest = bytes.fromhex(saved.digest)
    answer = {"stale": (5, digest), "none": None, "other_digest": (4, b"\x01" * 32), "tampered": (4, digest)}
    _fresh_vouch(monkeypatch, answer[why])
    if why == "tampered":  # the file's parameters are not the ones its digest names
        key = next(k for k in saved.tensors if k.startswith("model."))
        saved.tensors[key] = saved.tensors[key] + 1.0
    restarted, coll = Trainer(_cfg(tmp_path, **{"train.seed": 7})), _Collective()
    before = shared_digest(restarted)
    assert not adopt_saved_state(None, restarted, coll, saved)
    assert shared_digest(restarted) == before and restarted.step == 0 and coll.round_id == 0
