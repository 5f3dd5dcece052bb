"""The Trainer: learning against its own starting point, the strategy hook, metrics, checkpoint codec."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from optimizers.base import StrategyContext
from swarmtrain.app.train.checkpoint import (
    CheckpointError,
    pack_state,
    read_checkpoint,
    unpack_state,
    write_checkpoint,
)
from swarmtrain.app.train.lr import lr_at
from swarmtrain.app.train.trainer import StepInfo, Trainer
from swarmtrain.core.config import Config, TrainConfig, load_config
from swarmtrain.core.protocols import StepReport


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    """The machine is shared and small: one torch thread avoids oversubscription stalls."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_config(tmp_path: Path, **over: Any) -> Config:
    base = {
        "model.n_layer": 1,
        "model.n_head": 2,
        "model.n_embd": 32,
        "model.block_size": 32,
        "data.max_bytes": 400_000,
        "train.batch_size": 8,
        "train.steps": 40,
        "train.warmup_steps": 5,
        "train.lr": 3e-3,
        "train.eval_batches": 4,
        "train.eval_interval": 20,
        "train.log_interval": 10,
        "train.device": "cpu",
        "train.progress": False,
        "train.out_dir": str(tmp_path / "run"),
    }
    base.update(over)
    return load_config(overrides=base, env={})


def test_fit_learns_against_its_initial_loss(tmp_path: Path) -> None:
    trainer = Trainer(small_config(tmp_path, **{"train.steps": 60}))
    before = trainer.evaluate()
    assert abs(before - math.log(256)) < 0.5
    result = trainer.fit()
    assert result.steps == 60 and result.tokens == 60 * 8 * 32
    assert result.final_val_loss is not None and result.final_val_loss < before - 1.0
    assert trainer.evaluate() == pytest.approx(result.final_val_loss)  # deterministic eval


class SpyStrategy:
    """Checks the trainer's side of the hook contract and reports fake traffic."""

    name = "spy"

    def __init__(self, ctx: StrategyContext) -> None:
        self.ctx = ctx
        self.calls: list[tuple[int, float, float]] = []

    def step(self, tokens: int) -> StepReport:
        grads = [p.grad for p in self.ctx.model.parameters()]
        assert all(g is not None for g in grads), "strategy.step must see gradients"
        norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g) for g in grads if g is not None])
        )
        lr = self.ctx.optimizer.param_groups[0]["lr"]
        self.calls.append((tokens, float(norm), lr))
        self.ctx.optimizer.step()
        synced = len(self.calls) % 5 == 0
        return StepReport(
            synced=synced,
            committed=synced,
            round_id=len(self.calls),
            participants=2,
            bytes_sent=100 if synced else 0,
            bytes_received=50 if synced else 0,
            extra={"spy": 1.0},
        )

    def state_dict(self) -> dict[str, Any]:
        return {"calls": len(self.calls)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.calls = [(0, 0.0, 0.0)] * int(state["calls"])

    def close(self) -> None:
        return None


def test_strategy_hook_metrics_and_report(tmp_path: Path) -> None:
    cfg = small_config(tmp_path, **{"train.steps": 20, "train.grad_accum": 2, "train.grad_clip": 0.5})
    trainer = Trainer(cfg)
    # swapped in rather than registered, so the global strategy registry stays as the project defines it
    trainer.strategy = SpyStrategy(
        StrategyContext(trainer.model, trainer.optimizer, cfg.strategy, cfg.compression)
    )
    infos: list[StepInfo] = []
    result = trainer.fit(infos.append)
    spy = trainer.strategy
    assert isinstance(spy, SpyStrategy)
    assert [c[0] for c in spy.calls] == [8 * 32 * 2] * 20  # tokens per step include accumulation
    assert all(c[1] <= 0.5 + 1e-4 for c in spy.calls)  # clipped before the hook
    assert [c[2] for c in spy.calls] == [lr_at(i, cfg.train) for i in range(20)]  # LR set by the trainer
    assert [i.step for i in infos] == list(range(1, 21))
    assert infos[4].report.synced and infos[4].report.bytes_sent == 100
    assert all(math.isfinite(i.loss) for i in infos)
    assert result.bytes_sent == 400 and result.bytes_received == 200
    lines = [json.loads(x) for x in Path(result.metrics_path or "").read_text().splitlines()]
    kinds = [x["kind"] for x in lines]
    assert kinds.count("sync") == 4 and kinds.count("train") == 2 and kinds.count("eval") == 1
    sync = next(x for x in lines if x["kind"] == "sync")
    assert sync["round_bytes_sent"] == 100 and sync["x_spy"] == 1.0
    last_train = [x for x in lines if x["kind"] == "train"][-1]
    assert last_train["bytes_sent"] == 400 and last_train["step"] == 20
    assert trainer.optimizer.param_groups[0]["params"][0].grad is None  # the trainer zeroes grads


def test_max_time_and_max_steps_stop_early(tmp_path: Path) -> None:
    trainer = Trainer(small_config(tmp_path, **{"train.steps": 1_000_000}))
    assert trainer.fit(max_steps=3).steps == 3
    trainer.config.train.max_time = 0.5
    result = trainer.fit()
    assert 3 < result.steps < 1_000_000 and result.final_val_loss is not None


def test_lr_schedule() -> None:
    tc = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, steps=110)
    assert lr_at(0, tc) == pytest.approx(0.1)
    assert lr_at(9, tc) == pytest.approx(1.0)
    assert lr_at(10, tc) == pytest.approx(1.0)
    assert lr_at(60, tc) == pytest.approx(0.55)
    assert lr_at(110, tc) == pytest.approx(0.1) and lr_at(500, tc) == pytest.approx(0.1)
    values = [lr_at(i, tc) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))


def test_pack_state_round_trip() -> None:
    shared = torch.arange(6, dtype=torch.float32)
    tree = {
        "state": {0: {"step": torch.tensor(3.0), "m": torch.ones(2, 3, dtype=torch.bfloat16)}, 1: {}},
        "groups": [{"betas": (0.9, 0.95), "lr": 1e-3, "nesterov": False, "name": None}],
        "weird": {"__tensor__": "not a ref", "x": float("nan"), "y": float("-inf")},
        "a": shared,
        "b": shared,  # same storage twice
        "u8": torch.tensor([1, 2, 255], dtype=torch.uint8),
    }
    tensors, skeleton = pack_state(tree)
    json.dumps(skeleton)  # the skeleton is plain JSON
    back = unpack_state(json.loads(json.dumps(skeleton)), tensors)
    assert back["groups"][0]["betas"] == (0.9, 0.95) and isinstance(back["groups"][0]["betas"], tuple)
    assert set(back["state"]) == {0, 1}
    assert (
        torch.equal(back["state"][0]["m"], tree["state"][0]["m"])
        and back["state"][0]["m"].dtype == torch.bfloat16
    )
    assert back["weird"]["__tensor__"] == "not a ref" and math.isnan(back["weird"]["x"])
    assert back["weird"]["y"] == float("-inf")
    assert torch.equal(back["a"], shared) and torch.equal(back["b"], shared)
    with pytest.raises(CheckpointError):
        pack_state({"bad": object()})
    with pytest.raises(CheckpointError, match="missing tensor"):
        unpack_state({"__tensor__": "nope"}, {})


def test_checkpoint_files_and_errors(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "ck", {"x": torch.ones(3), "n": 1})
    assert sorted(p.name for p in d.iterdir()) == ["meta.json", "tensors.safetensors"]
    assert torch.equal(read_checkpoint(d)["x"], torch.ones(3))
    (d / "meta.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_checkpoint(d)
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        read_checkpoint(tmp_path / "nowhere")


def test_resume_into_a_different_model_fails_clearly(tmp_path: Path) -> None:
    a = Trainer(small_config(tmp_path, **{"train.steps": 2}))
    a.fit()
    a.save_checkpoint(tmp_path / "ck")
    b = Trainer(small_config(tmp_path, **{"model.n_embd": 48}))
    with pytest.raises(CheckpointError, match="does not fit"):
        b.load_checkpoint(tmp_path / "ck")


def test_peers_start_identical_and_read_disjoint_data(tmp_path: Path) -> None:
    cfg = small_config(tmp_path)
    a = Trainer(cfg, peer_index=0, num_peers=2)
    torch.rand(100)  # a peer's global RNG history must not matter
    b = Trainer(cfg, peer_index=1, num_peers=2)
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    starts_a = {int(s) for step in range(5) for s in a.sampler.starts(step)}
    starts_b = {int(s) for step in range(5) for s in b.sampler.starts(step)}
    assert starts_a.isdisjoint(starts_b)
    assert a.metrics_path != b.metrics_path and a.checkpoint_dir != b.checkpoint_dir
    assert a.evaluate() == b.evaluate()  # same parameters, same held-out batches


def test_a_peer_state_round_trips_and_a_bad_one_changes_nothing(tmp_path: Path) -> None:
    """What a donor serves loads into a newcomer bit-exactly; a state of another model, another
    strategy or without a valid step is refused (``ProtocolError``) before anything changes."""
    from swarmtrain.app.peer.state import apply_state, shared_digest, state_snapshot
    from swarmtrain.core.errors import ProtocolError

    donor = Trainer(small_config(tmp_path, **{"train.steps": 3}))
    donor.fit()
    tensors, meta = state_snapshot(donor, round_id=7)
    newcomer = Trainer(small_config(tmp_path, **{"train.seed": 5}))
    before = shared_digest(newcomer)
    bad_meta = [{**meta, "strategy_name": "nosuch"}, {**meta, "step": -1}, {**meta, "round": "7"}]
    other = Trainer(small_config(tmp_path, **{"model.n_embd": 48}))
    for t, m in [(tensors, bm) for bm in bad_meta] + [(state_snapshot(other, 7)[0], meta)]:
        with pytest.raises(ProtocolError):
            apply_state(newcomer, t, m)
        assert shared_digest(newcomer) == before and newcomer.step == 0
    assert apply_state(newcomer, tensors, meta) == 7
    assert shared_digest(newcomer) == shared_digest(donor) and newcomer.step == donor.step == 3
