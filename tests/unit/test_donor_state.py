"""What a donor's state can plant in a newcomer (issue 30.1, finding 2): hyper-parameters come from
this peer's config, never from a donor; rounds and steps are bounded by the parser; local weights (no
digest covers them) are taken only near the donor's anchor, else rebuilt from it; the vouched digest
covers the outer optimizer's state besides the shared parameters. A mutation test plants extreme
numbers in every field of a real DiLoCo snapshot (``swarmtrain.app.peer.state``)."""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from optimizers.inprocess import InProcessGroup
from peers.state.donors import MAX_ROUND, encode_announcement, parse_announcement
from peers.state.state_transfer import parse_state, serialize_state
from swarmtrain.app.peer.state import (
    LOCAL_DRIFT_ABS,
    LOCAL_DRIFT_REL,
    apply_state,
    shared_digest,
    state_snapshot,
)
from swarmtrain.app.train.trainer import Trainer
from swarmtrain.core.config import load_config
from swarmtrain.core.errors import ProtocolError


def _trainer(out: Path, seed: int = 0, outer_lr: float = 0.7) -> Trainer:
    cfg = load_config(
        env={},
        overrides={
            "model.n_layer": 1,
            "model.n_head": 2,
            "model.n_embd": 16,
            "model.block_size": 16,
            "model.dropout": 0.0,
            "data.max_bytes": 50_000,
            "train.batch_size": 2,
            "train.grad_accum": 1,
            "train.steps": 20,
            "train.warmup_steps": 1,
            "train.eval_batches": 1,
            "train.seed": seed,
            "train.progress": False,
            "train.out_dir": str(out),
            "strategy.name": "diloco",
            "strategy.inner_steps": 2,
            "strategy.outer_lr": outer_lr,
            "strategy.outer_momentum": 0.9,
        },
    )
    return Trainer(cfg, collective=InProcessGroup(1)[0])


@pytest.fixture(scope="module")
def donor(tmp_path_factory: pytest.TempPathFactory) -> Trainer:
    t = _trainer(tmp_path_factory.mktemp("donor"))
    for _ in range(3):  # one outer step (the momentum exists), then one inner step past it
        t.train_step()
    return t


def _outer(t: Trainer) -> Any:
    return t.strategy.store.outer  # type: ignore[attr-defined]


def _anchor(t: Trainer) -> dict[str, torch.Tensor]:
    return dict(t.strategy.global_parameters())  # type: ignore[attr-defined]


def test_hyperparameters_come_from_this_peers_config_not_the_donor(donor: Trainer, tmp_path: Path) -> None:
    tensors, meta = state_snapshot(donor, round_id=5)
    meta = copy.deepcopy(meta)
    newcomer = _trainer(tmp_path, seed=1, outer_lr=0.5)
    own = (_outer(newcomer).lr, _outer(newcomer).momentum, _outer(newcomer).nesterov)
    assert own[:2] == (0.5, 0.9)
    meta["strategy"]["outer"].update(lr=1e12, momentum=0.999, nesterov=not own[2])
    assert apply_state(newcomer, tensors, meta) == 5
    assert (_outer(newcomer).lr, _outer(newcomer).momentum, _outer(newcomer).nesterov) == own
    assert shared_digest(newcomer) == shared_digest(donor)  # the shared state itself was adopted


@pytest.mark.parametrize("rnd", [MAX_ROUND + 1, 1 << 62])
def test_a_round_beyond_the_bound_is_refused_by_the_parsers(donor: Trainer, tmp_path: Path, rnd: int) -> None:
    tensors, meta = state_snapshot(donor, round_id=5)
    newcomer = _trainer(tmp_path, seed=1)
    before = shared_digest(newcomer)
    for bad in ({**meta, "round": rnd}, {**meta, "step": 1 << 62}):
        with pytest.raises(ProtocolError):
            apply_state(newcomer, tensors, bad)
    assert shared_digest(newcomer) == before
    with pytest.raises(ProtocolError, match="out of range"):
        parse_announcement(encode_announcement(b"h" * 32, 10, rnd, [], b"m" * 32, leaving=False))
    with pytest.raises(ProtocolError):
        parse_announcement(
            encode_announcement(b"h" * 32, 10, 3, [(rnd, b"d" * 32)], b"m" * 32, leaving=False)
        )


def test_local_weights_far_from_the_anchor_are_rebuilt_from_it(donor: Trainer, tmp_path: Path) -> None:
    """A donor that copies the honest anchor (and so the vouched digest) but serves local weights +100:
    the newcomer starts from the anchor, with fresh inner moments; an honest donor's drift is kept."""
    tensors, meta = state_snapshot(donor, round_id=5)
    honest = _trainer(tmp_path / "h", seed=1)
    apply_state(honest, tensors, meta)
    donor_local = dict(donor.model.named_parameters())
    assert any(not torch.equal(p, _anchor(donor)[n]) for n, p in donor_local.items())  # it drifted
    assert all(torch.equal(p, donor_local[n]) for n, p in honest.model.named_parameters())
    forged = {k: (v + 100 if k.startswith("model.") else v) for k, v in tensors.items()}
    newcomer = _trainer(tmp_path / "n", seed=1)
    assert apply_state(newcomer, forged, meta) == 5
    anchor = _anchor(donor)
    for n, p in newcomer.model.named_parameters():
        assert torch.equal(p, anchor[n].to(p.dtype)), n
    assert not newcomer.optimizer.state  # the donor's inner state went with its weights
    assert shared_digest(newcomer) == shared_digest(donor)


def test_the_digest_covers_the_outer_momentum(donor: Trainer, tmp_path: Path) -> None:
    """A state whose parameters are the vouched ones but whose outer momentum is planted does not hash
    to the vouched digest, so a newcomer refuses it (``adopt_swarm_state``)."""
    tensors, meta = state_snapshot(donor, round_id=5)
    forged = {k: (v + 1 if k.startswith("strategy.outer.buffers") else v) for k, v in tensors.items()}
    assert forged.keys() == tensors.keys() and any(k.startswith("strategy.outer.buffers") for k in tensors)
    newcomer = _trainer(tmp_path, seed=1)
    apply_state(newcomer, forged, meta)
    assert shared_digest(newcomer) != shared_digest(donor)


def _numbers(tree: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every number in a JSON skeleton (tensor references left out)."""
    if isinstance(tree, dict) and "__tensor__" not in tree:
        for k, v in tree.items():
            yield from _numbers(v, (*path, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _numbers(v, (*path, i))
    elif isinstance(tree, int | float) and not isinstance(tree, bool):
        yield path


def test_3000_mutated_states_plant_nothing(donor: Trainer, tmp_path: Path) -> None:
    """Extreme numbers in the meta and strategy skeleton, and scaled local weights: every state is
    refused (``ProtocolError``) or, when taken, leaves this peer's hyper-parameters, a bounded round
    and local weights within the drift bound of the adopted anchor (issue 30 measured 65 of 3,000
    mutated states planting something on the old code)."""
    tensors, meta = state_snapshot(donor, round_id=5)
    data = serialize_state(tensors, meta)
    newcomer = _trainer(tmp_path, seed=1, outer_lr=0.5)
    own = (_outer(newcomer).lr, _outer(newcomer).momentum, _outer(newcomer).nesterov)
    paths = list(_numbers(meta))
    rng = random.Random(30)
    extremes = [1e12, -1.0, 0.0, 1 << 62, (1 << 40) + 1, 1e-30, 0.999999, 2, 7, True]
    taken = 0
    for i in range(3000):
        t, m = parse_state(data)
        for _ in range(rng.randint(1, 3)):
            *head, last = rng.choice(paths)
            node = m
            for k in head:
                node = node[k]
            node[last] = rng.choice(extremes)
        if i % 3 == 0:
            name = rng.choice([k for k in t if k.startswith("model.")])
            t[name] = t[name] * rng.choice([3.0, 100.0, -1.0])
        try:
            rnd = apply_state(newcomer, t, m)
        except ProtocolError:
            continue
        taken += 1
        outer = _outer(newcomer)
        assert (outer.lr, outer.momentum, outer.nesterov) == own, i
        assert 0 <= rnd <= MAX_ROUND and newcomer.step <= 1 << 48, i
        anchor = _anchor(newcomer)
        for n, p in newcomer.model.named_parameters():
            a = anchor[n].float()
            drift = (p.float() - a).pow(2).mean().sqrt().item()
            assert drift <= LOCAL_DRIFT_REL * a.pow(2).mean().sqrt().item() + LOCAL_DRIFT_ABS + 1e-6, (i, n)
            assert math.isfinite(drift)
    assert taken > 100  # mutations of harmless fields still load
