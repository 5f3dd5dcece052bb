"""Exact resume: 2N steps straight == N steps, checkpoint, resume in a fresh process, N steps.

Every parameter, and the optimizer's moments, must be bit-identical (``torch.equal``). The resumed
half runs in a fresh interpreter, so nothing but the checkpoint carries state across the split.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
N = 6

SCRIPT = f"N = {N}\n" + textwrap.dedent(
    """
    import sys, torch
    from safetensors.torch import save_file
    from swarmtrain.core.config import load_config
    from swarmtrain.app.train.trainer import Trainer

    torch.set_num_threads(1)  # same thread count in every process: same float reduction order
    out = sys.argv[2]


    def run(mode):
        cfg = load_config(env={}, overrides={
            "model.n_layer": 2, "model.n_head": 2, "model.n_embd": 32, "model.block_size": 32,
            "model.dropout": 0.1,  # exercises the torch RNG state in the checkpoint
            "data.max_bytes": 300_000, "train.batch_size": 4, "train.grad_accum": 2,
            "train.steps": 2 * N, "train.warmup_steps": 3, "train.eval_interval": 4,
            "train.device": "cpu", "train.progress": False, "train.out_dir": out + "/run-" + mode,
        })
        t = Trainer(cfg)
        if mode == "straight":
            t.fit()
        elif mode == "first":
            t.fit(max_steps=N)
            t.save_checkpoint(out + "/ck")
        else:
            t.load_checkpoint(out + "/ck")
            assert t.step == N
            t.fit()
        assert t.step == (N if mode == "first" else 2 * N)
        tensors = {"p." + n: p.detach().clone() for n, p in t.model.named_parameters()}
        for i, st in t.optimizer.state_dict()["state"].items():
            for k, v in st.items():
                if torch.is_tensor(v):
                    tensors[f"o.{i}.{k}"] = v.clone()
        save_file(tensors, out + "/" + mode + ".safetensors")


    for mode in sys.argv[1].split(","):
        run(mode)
    """
)


def _run(mode: str, tmp: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(tmp)], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]


def test_resume_is_bit_exact(tmp_path: Path) -> None:
    _run("straight,first", tmp_path)  # one process: the straight run, then the first half + checkpoint
    _run("resumed", tmp_path)  # a fresh process: only the checkpoint carries state
    straight = load_file(str(tmp_path / "straight.safetensors"))
    resumed = load_file(str(tmp_path / "resumed.safetensors"))
    assert straight.keys() == resumed.keys() and any(k.startswith("o.") for k in straight)
    differing = [k for k in straight if not torch.equal(straight[k], resumed[k])]
    assert not differing, f"not bit-exact after resume: {differing[:5]}"
    first = load_file(str(tmp_path / "first.safetensors"))
    assert not torch.equal(first["p.wte.weight"], straight["p.wte.weight"])  # the second half did train
