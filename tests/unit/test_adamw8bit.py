"""8-bit AdamW (bitsandbytes) as the inner optimizer: it learns like AdamW on the tiny preset, its
uint8 state and absmax/quantization maps go through safetensors checkpoints and resume bit-exactly,
a state of another kind or shape is refused with nothing changed, and the CLI takes ``--optimizer``.

bitsandbytes is in the ``dev`` extra, so these tests run in CI (no skip without it); the missing-
package path is simulated by blocking its import.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from swarmtrain.app.cli import run
from swarmtrain.app.peer.state import apply_state, state_snapshot
from swarmtrain.app.train.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from swarmtrain.app.train.inner_optim import build_optimizer, check_optimizer_state, load_bitsandbytes
from swarmtrain.app.train.trainer import Trainer
from swarmtrain.core.config import Config, load_config
from swarmtrain.core.errors import ConfigError, ProtocolError

STEPS = 40  # tiny preset, 40 steps of 8 x 128 tokens: ~1-2 s per optimizer on one thread


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny(tmp_path: Path, optimizer: str, **over: Any) -> Config:
    base = {
        "model.preset": "tiny",
        "data.max_bytes": 400_000,
        "train.optimizer": optimizer,
        "train.batch_size": 8,
        "train.steps": STEPS,
        "train.warmup_steps": 5,
        "train.lr": 3e-3,
        "train.eval_batches": 4,
        "train.eval_interval": 1000,
        "train.log_interval": 1000,
        "train.device": "cpu",
        "train.progress": False,
        "train.out_dir": str(tmp_path / optimizer),
    }
    base.update(over)
    return load_config(overrides=base, env={})


def flat_optimizer_state(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Every leaf of ``opt.state_dict()['state']`` by a dotted name (bitsandbytes nests some)."""
    out: dict[str, Any] = {}

    def walk(obj: Any, name: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{name}.{k}")
        else:
            out[name] = obj

    walk(opt.state_dict()["state"], "state")
    return out


def snapshot(t: Trainer) -> dict[str, Any]:
    state: dict[str, Any] = {"p." + n: p.detach().clone() for n, p in t.model.named_parameters()}
    for k, v in flat_optimizer_state(t.optimizer).items():
        state["o" + k] = v.clone() if torch.is_tensor(v) else v
    return state


def assert_identical(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    differing = [
        k
        for k in a
        if (torch.is_tensor(a[k]) and (a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])))
        or (not torch.is_tensor(a[k]) and a[k] != b[k])
    ]
    assert not differing, f"not bit-identical: {differing[:5]}"


# ------------------------------------------------------------------------------ loss vs AdamW
def test_adamw8bit_trains_the_tiny_preset_like_adamw(tmp_path: Path) -> None:
    losses: dict[str, list[float]] = {}
    val: dict[str, float] = {}
    tps: dict[str, float] = {}
    for kind in ("adamw", "adamw8bit"):
        trainer = Trainer(tiny(tmp_path, kind))
        steps: list[float] = []
        result = trainer.fit(lambda info, s=steps: s.append(info.loss))  # type: ignore[misc]
        losses[kind], val[kind] = steps, float(result.final_val_loss or "nan")
        tps[kind] = result.tokens / max(result.train_s, 1e-9)
        trainer.close()
    last = {k: sum(v[-10:]) / 10 for k, v in losses.items()}  # mean train loss of the last 10 steps
    rel_train = (last["adamw8bit"] - last["adamw"]) / last["adamw"]
    rel_val = (val["adamw8bit"] - val["adamw"]) / val["adamw"]
    print(
        f"\ntiny preset, {STEPS} steps x 8 x 128 tokens, lr 3e-3, seed 0, CPU: "
        f"first loss {losses['adamw'][0]:.4f}; mean train loss of the last 10 steps "
        f"adamw {last['adamw']:.4f} adamw8bit {last['adamw8bit']:.4f} ({100 * rel_train:+.2f} %); "
        f"val adamw {val['adamw']:.4f} adamw8bit {val['adamw8bit']:.4f} ({100 * rel_val:+.2f} %)"
        f"; tokens/s adamw {tps['adamw']:,.0f} adamw8bit {tps['adamw8bit']:,.0f}"
    )
    # same start (same init, same first batch), and both learned well below it: an optimizer that
    # does not step (or steps wrongly) stays near ln(256) = 5.55 or diverges
    assert losses["adamw8bit"][0] == pytest.approx(losses["adamw"][0], rel=1e-6)
    assert last["adamw"] < losses["adamw"][0] - 1.5
    assert last["adamw8bit"] < losses["adamw8bit"][0] - 1.5
    # goal 1 %; the bound is generous for other machines' float order, tight enough to catch a
    # broken update (the measured difference is printed above and recorded in docs/benchmarks.md)
    assert abs(rel_train) < 0.03 and abs(rel_val) < 0.03


def test_8bit_state_is_uint8_and_about_a_quarter_of_adamw(tmp_path: Path) -> None:
    sizes = {}
    for kind in ("adamw", "adamw8bit"):
        trainer = Trainer(tiny(tmp_path, kind, **{"train.steps": 1}))
        trainer.fit()
        flat = flat_optimizer_state(trainer.optimizer)
        tensors = {k: v for k, v in flat.items() if torch.is_tensor(v) and not k.endswith(("qmap1", "qmap2"))}
        sizes[kind] = sum(t.numel() * t.element_size() for t in tensors.values())
        if kind == "adamw8bit":
            assert any(t.dtype == torch.uint8 for t in tensors.values())
            assert any(k.endswith("absmax1") for k in tensors)
        trainer.close()
    ratio = sizes["adamw8bit"] / sizes["adamw"]
    print(
        f"\ntiny preset inner optimizer state: adamw {sizes['adamw']:,} B, adamw8bit {sizes['adamw8bit']:,} B"
    )
    assert 0.2 < ratio < 0.3, ratio


# ---------------------------------------------------------------------------- bit-exact resume
def test_checkpoint_resume_is_bit_exact(tmp_path: Path) -> None:
    n = 5
    cfg = tiny(tmp_path, "adamw8bit", **{"train.steps": 2 * n, "model.dropout": 0.1})
    straight = Trainer(cfg)
    straight.fit()
    want = snapshot(straight)

    first = Trainer(cfg)
    first.fit(max_steps=n)
    ck = first.save_checkpoint(tmp_path / "ck")
    saved = snapshot(first)
    # the state on disk holds the uint8 codes and float32 absmax/qmaps as they were
    tensors = read_checkpoint(ck)["optimizer"]["state"]
    assert any(
        t.dtype == torch.uint8
        for e in tensors.values()
        for t in e.get("__bnb_optimizer_quant_state__", {}).values()
    )

    resumed = Trainer(cfg)
    resumed.load_checkpoint(ck)
    assert_identical(snapshot(resumed), saved)  # the round trip itself is exact
    resumed.fit()
    assert resumed.step == 2 * n
    assert_identical(snapshot(resumed), want)


def _written(tmp_path: Path, trainer: Trainer, name: str, edit: Any = None) -> Path:
    """A checkpoint of ``trainer`` with ``edit`` applied to its state tree before writing."""
    path = trainer.save_checkpoint(tmp_path / name)
    if edit is not None:
        state = read_checkpoint(path)
        edit(state)
        write_checkpoint(path, state)
    return path


def test_a_state_that_does_not_fit_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    cfg8 = tiny(tmp_path, "adamw8bit", **{"train.steps": 2})
    donor = Trainer(cfg8)
    donor.fit()
    target = Trainer(tiny(tmp_path, "adamw8bit", **{"train.steps": 2, "train.seed": 1}))
    target.fit()
    before = snapshot(target)

    def wrap(state: dict[str, Any]) -> dict[str, Any]:
        return state["optimizer"]["state"][0]["__bnb_optimizer_quant_state__"]

    def short_absmax(s: dict[str, Any]) -> None:
        wrap(s)["absmax1"] = wrap(s)["absmax1"][:-1].clone()

    def float_codes(s: dict[str, Any]) -> None:
        wrap(s)["state2"] = wrap(s)["state2"].float()

    def renamed(s: dict[str, Any]) -> None:
        wrap(s)["state3"] = wrap(s).pop("state2")

    def extra_entry(s: dict[str, Any]) -> None:
        s["optimizer"]["state"][999] = s["optimizer"]["state"][0]

    cases = {
        "short_absmax": (short_absmax, "absmax1"),
        "float_codes": (float_codes, "state2"),
        "renamed": (renamed, "state3"),
        "extra_entry": (extra_entry, "999"),
    }
    for name, (edit, needle) in cases.items():
        path = _written(tmp_path, donor, name, edit)
        with pytest.raises(CheckpointError, match=needle):
            target.load_checkpoint(path)
        assert_identical(snapshot(target), before)
        assert target.step == 2

    # an AdamW checkpoint resumed as adamw8bit (and the state itself checked, were the kind not named)
    plain = Trainer(tiny(tmp_path, "adamw", **{"train.steps": 2}))
    plain.fit()
    path = _written(tmp_path, plain, "adamw")
    with pytest.raises(CheckpointError, match="adamw optimizer state"):
        target.load_checkpoint(path)
    with pytest.raises(CheckpointError, match="exp_avg"):
        check_optimizer_state(target.optimizer, "adamw8bit", plain.optimizer.state_dict())
    with pytest.raises(CheckpointError, match="groups"):
        check_optimizer_state(target.optimizer, "adamw8bit", {"state": {}, "param_groups": []})
    assert_identical(snapshot(target), before)
    check_optimizer_state(target.optimizer, "adamw8bit", donor.optimizer.state_dict())  # fits


def _with_negative_step(skeleton: Any) -> Any:
    """The packed optimizer state with every ``step`` entry set to -1 (keys sit in ``__map__`` pairs)."""
    if isinstance(skeleton, list):
        if len(skeleton) == 2 and skeleton[0] == "step" and isinstance(skeleton[1], int | float):
            return ["step", -1]
        return [_with_negative_step(v) for v in skeleton]
    if isinstance(skeleton, dict):
        return {
            k: (-1 if k == "step" and isinstance(v, int | float) else _with_negative_step(v))
            for k, v in skeleton.items()
        }
    return skeleton


def test_newcomer_download_carries_the_8bit_state_bit_exactly(tmp_path: Path) -> None:
    """Parameters, strategy state, step and the inner optimizer's 8-bit state travel and load
    bit-exactly; the newcomer keeps its own hyperparameters; a donor with another optimizer kind, a
    tensor of the wrong shape, a NaN or a negative step in the optimizer state or a malformed strategy
    state is refused and changes nothing; a donor with another optimizer kind gives the parameters and
    strategy state but not its inner state."""
    donor = Trainer(tiny(tmp_path, "adamw8bit", **{"train.steps": 3, "train.weight_decay": 0.5}))
    donor.fit()
    newcomer = Trainer(tiny(tmp_path, "adamw8bit", **{"train.steps": 3, "train.seed": 1}))
    own_decay = newcomer.optimizer.param_groups[0]["weight_decay"]
    assert own_decay != 0.5
    tensors, meta = state_snapshot(donor, round_id=7)
    assert apply_state(newcomer, tensors, meta) == 7
    assert newcomer.step == 3
    for n, p in newcomer.model.named_parameters():
        assert torch.equal(p, dict(donor.model.named_parameters())[n])
    theirs, ours = flat_optimizer_state(donor.optimizer), flat_optimizer_state(newcomer.optimizer)
    assert theirs.keys() == ours.keys()
    for k, v in theirs.items():
        assert torch.equal(v, ours[k]) if isinstance(v, torch.Tensor) else v == ours[k], k
    assert newcomer.optimizer.param_groups[0]["weight_decay"] == own_decay  # its own config, not the donor's

    # a donor with another optimizer kind: parameters and strategy state load, the inner state stays
    other = Trainer(tiny(tmp_path, "adamw8bit", **{"train.steps": 3, "train.seed": 3}))
    own = flat_optimizer_state(other.optimizer)
    assert apply_state(other, tensors, {**meta, "optimizer_kind": "adamw"}) == 7
    for n, p in other.model.named_parameters():
        assert torch.equal(p, dict(donor.model.named_parameters())[n])
    assert flat_optimizer_state(other.optimizer).keys() == own.keys()
    assert all(
        torch.equal(v, own[k])
        for k, v in flat_optimizer_state(other.optimizer).items()
        if isinstance(v, torch.Tensor)
    )

    fresh = Trainer(tiny(tmp_path, "adamw8bit", **{"train.steps": 3, "train.seed": 2}))
    before = {n: p.clone() for n, p in fresh.model.named_parameters()}
    bad_shape = dict(tensors)
    bad_shape["model.lm_head.weight" if "model.lm_head.weight" in bad_shape else next(iter(bad_shape))] = (
        torch.zeros(3)
    )
    nan_state = dict(tensors)
    name = next(n for n, t in tensors.items() if n.startswith("optimizer") and t.is_floating_point())
    nan_state[name] = torch.full_like(tensors[name], float("nan"))
    neg_step = {**meta, "optimizer": _with_negative_step(meta["optimizer"])}
    assert neg_step["optimizer"] != meta["optimizer"]
    bad_strategy = {**meta, "strategy": {"outer": []}}
    cases = [(bad_shape, meta), (nan_state, meta), (tensors, neg_step), (tensors, bad_strategy)]
    for t_bad, m_bad in cases:
        with pytest.raises(ProtocolError):
            apply_state(fresh, t_bad, m_bad)
    assert fresh.step == 0
    for n, p in fresh.model.named_parameters():
        assert torch.equal(p, before[n]), n


# ----------------------------------------------------------------------- without bitsandbytes
def test_without_bitsandbytes_it_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    load_bitsandbytes()  # installed here (the dev extra)
    for mod in [m for m in sys.modules if m == "bitsandbytes" or m.startswith("bitsandbytes.")]:
        monkeypatch.setitem(sys.modules, mod, None)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"adamw8bit needs bitsandbytes.*pip install -e \"\.\[cuda\]\""):
        load_bitsandbytes()
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ConfigError, match="bitsandbytes"):
        build_optimizer(model, tiny(tmp_path, "adamw8bit"), torch.device("cpu"))
    assert run(["train", "--optimizer", "adamw8bit", "--steps", "1", "--no-progress", "--device", "cpu"]) == 2
    _, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("swarmtrain: error: ") and "bitsandbytes" in lines[0]
    assert "Traceback" not in err


# --------------------------------------------------------------------------------------- CLI
def test_cli_trains_and_resumes_with_adamw8bit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(3000)))
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        "[model]\nn_layer = 1\nn_head = 2\nn_embd = 64\nblock_size = 32\n"
        "[train]\nbatch_size = 4\neval_batches = 2\nlog_interval = 2\n"
    )
    out_dir = tmp_path / "run"
    common = ["--no-progress", "--device", "cpu"]
    argv = ["train", "-c", str(cfg), "--data", str(text), "--out-dir", str(out_dir), *common]
    assert run([*argv, "--optimizer", "adamw8bit", "--steps", "4"]) == 0
    assert "final train loss" in capsys.readouterr().out
    meta = json.loads((out_dir / "checkpoint" / "meta.json").read_text())["state"]
    assert meta["optimizer_kind"] == "adamw8bit" and meta["config"]["train"]["optimizer"] == "adamw8bit"
    # a bare --resume keeps the saved optimizer; switching it on resume is one line
    assert run(["train", "--resume", str(out_dir / "checkpoint"), "--steps", "6", *common]) == 0
    assert "step 6/6" in capsys.readouterr().out
    ck = str(out_dir / "checkpoint")
    assert run(["train", "--resume", ck, "--steps", "8", "--optimizer", "adamw", *common]) == 1
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and "adamw8bit optimizer state" in err[0]


def test_a_bad_optimizer_value_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["train", "--optimizer", "adam8"]) == 2
    _, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "train.optimizer" in lines[0] and "adamw8bit" in lines[0], err


# -------------------------------------------------------------------------------------- CUDA
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU path runs above)")
def test_cuda_adamw8bit_resumes_bit_exactly(tmp_path: Path) -> None:
    n = 4
    cfg = tiny(tmp_path, "adamw8bit", **{"train.steps": 2 * n, "train.device": "cuda", "train.bf16": "off"})
    straight = Trainer(cfg)
    straight.fit()
    first = Trainer(cfg)
    first.fit(max_steps=n)
    ck = first.save_checkpoint(tmp_path / "ck")
    resumed = Trainer(cfg)
    resumed.load_checkpoint(ck)
    resumed.fit()
    assert_identical(snapshot(resumed), snapshot(straight))
