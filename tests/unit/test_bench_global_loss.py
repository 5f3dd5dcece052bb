"""Streaming DiLoCo's reported loss is its global (anchor) model's, not a worker's mixed local model."""

from __future__ import annotations

import copy

import torch

from optimizers import InProcessGroup
from swarmtrain.app.bench.harness import global_loss
from swarmtrain.app.train.trainer import Trainer
from swarmtrain.core.config import load_config


def test_global_loss_evaluates_the_anchor_and_puts_the_local_model_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    overrides = {
        "strategy.name": "streaming_diloco",
        "strategy.inner_steps": 4,
        "strategy.fragments": 2,
        "strategy.mixing": 0.5,
        "compression.codec": "none",
        "train.steps": 6,
        "train.batch_size": 4,
        "train.eval_batches": 2,
        "train.eval_interval": 10_000,
        "train.progress": False,
        "train.out_dir": str(tmp_path),
    }
    trainer = Trainer(load_config(None, overrides, env={}), collective=InProcessGroup(1, timeout=60)[0])
    try:
        trainer.fit()
        local = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        anchor = copy.deepcopy(trainer.model)
        with torch.no_grad():
            for n, p in anchor.named_parameters():
                p.copy_(trainer.strategy.global_parameters()[n])
        assert any(not torch.equal(local[n], p) for n, p in anchor.named_parameters())  # they differ
        got = global_loss(trainer)
        assert all(torch.equal(local[n], p) for n, p in trainer.model.named_parameters())  # put back
        own = trainer.evaluate()
        trainer.model, saved = anchor, trainer.model
        trainer._forward = anchor  # evaluate() runs the model through _forward
        want = trainer.evaluate()
        trainer.model = trainer._forward = saved
        assert got == want and got != own
    finally:
        trainer.close()
