"""Peak training memory: fp32 AdamW vs 8-bit AdamW states vs an offloaded outer state, measured
against the budget ``swarmtrain.app.train.memory_budget`` predicts.

Each configuration runs in a fresh subprocess (so peaks do not mix): a ``Trainer`` with DiLoCo
(H = 2) on a one-member in-process collective, a few steps including syncs. Measured: on CUDA the
allocator's ``torch.cuda.max_memory_allocated`` (device) against the budget's device peak; on CPU the
peak resident set size above the RSS before the trainer is built (sampled every 2 ms; a short
forward/backward of a throwaway model first, so one-time library buffers are outside), against the
budget's whole peak (device and host are one RAM there). A row whose prerequisite is missing (the
``bitsandbytes`` package, or a config field another change adds) says so instead of a figure.

From the budget arithmetic (not measured) it derives how much larger a model a 16 GB volunteer can
train: the largest parameter count whose device bytes (weights, grads, states, sync buffers) plus a
fixed activation allowance fit in 15 GiB (16 GiB less 1 GiB of CUDA context and fragmentation), per
configuration, and the ratio of those counts.

    python benchmarks/memory.py                       # CPU, small preset -> results/memory_cpu.json
    python benchmarks/memory.py --device cuda --preset gpt2-124m --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MiB = 1 << 20
GiB = 1 << 30

# (key, label, train.optimizer, strategy, strategy.outer_state)
CONFIGS: list[tuple[str, str, str, str, str]] = [
    ("local_fp32", "fp32 AdamW, no strategy", "adamw", "local", "device"),
    ("diloco_fp32", "fp32 AdamW + DiLoCo, outer state on device", "adamw", "diloco", "device"),
    ("diloco_8bit", "8-bit AdamW + DiLoCo, outer state on device", "adamw8bit", "diloco", "device"),
    ("diloco_offload", "fp32 AdamW + DiLoCo, outer state on CPU", "adamw", "diloco", "cpu"),
    ("diloco_8bit_cpu8", "8-bit AdamW + DiLoCo, outer state on CPU in 8 bits", "adamw8bit", "diloco", "cpu8"),
]
VOLUNTEER_BYTES = 15 * GiB  # a 16 GiB card less 1 GiB of CUDA context and fragmentation
ACT_PRESET, ACT_BATCH = "gpt2-124m", 8  # the fixed activation allowance: this micro-batch, bf16


def build_config(
    preset: str, batch: int, steps: int, device: str, optimizer: str, strategy: str, outer: str, out_dir: str
) -> tuple[Any, str | None]:
    """``(config, None)``, or ``(config with the missing fields patched in, why it cannot run)``.

    The patched config serves the budget's prediction only: a field the config model does not have
    yet is set without validation, and the run is reported as not measured.
    """
    from swarmtrain.core.config import load_config
    from swarmtrain.core.errors import ConfigError

    base: dict[str, Any] = {
        "model.preset": preset,
        "train.batch_size": batch,
        "train.steps": steps,
        "train.device": device,
        "train.threads": 1,
        "train.warmup_steps": 0,
        "train.eval_interval": 10 * steps,
        "train.eval_batches": 1,
        "train.progress": False,
        "train.out_dir": out_dir,
        "data.max_bytes": 1 << 20,  # keep the corpus out of the measured RSS
        "strategy.name": strategy,
    }
    if strategy == "diloco":
        base["strategy.inner_steps"] = 2
    extra: dict[str, Any] = {}
    if optimizer != "adamw":
        extra["train.optimizer"] = optimizer
    if outer != "device":
        extra["strategy.outer_state"] = outer
    try:
        return load_config(env={}, overrides={**base, **extra}), None
    except ConfigError as e:
        why = f"not measured: {e}"
    cfg = load_config(env={}, overrides=base)
    train = cfg.train.model_construct(**{**cfg.train.model_dump(), "optimizer": optimizer})
    strat = cfg.strategy
    if outer != "device":
        strat = type(strat).model_construct(**{**strat.model_dump(), "outer_state": outer})
    return cfg.model_construct(**{**dict(cfg), "train": train, "strategy": strat}), why


def measure_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration in this process and return its figures (the ``--worker`` entry point)."""
    import torch
    from local_loop import PeakMemory  # type: ignore[import-not-found]  # benchmarks/ is sys.path[0]

    from optimizers import InProcessGroup
    from swarmtrain.app.train.memory_budget import memory_budget
    from swarmtrain.app.train.trainer import Trainer, resolve_device

    torch.set_num_threads(1)
    device = resolve_device(spec["device"])
    tmp = tempfile.mkdtemp(prefix="swarmtrain-mem-")
    cfg, why = build_config(
        spec["preset"],
        spec["batch"],
        spec["steps"],
        spec["device"],
        spec["optimizer"],
        spec["strategy"],
        spec["outer"],
        tmp,
    )
    budget = memory_budget(cfg, device.type)
    out: dict[str, Any] = {"budget": budget.as_dict(), "status": why or "measured"}
    if why is None and spec["optimizer"] == "adamw8bit":
        try:
            import bitsandbytes  # noqa: F401
        except Exception as e:  # ImportError, or a CUDA-setup failure of the package
            why = f"not measured: bitsandbytes missing ({type(e).__name__})"
            out["status"] = why
    if why is not None:
        return out
    # one-time buffers (thread pools, kernels' scratch) outside the measured region
    warm = torch.nn.Linear(64, 64).to(device)
    warm(torch.randn(8, 64, device=device)).sum().backward()
    del warm
    group = InProcessGroup(1) if spec["strategy"] != "local" else None
    t0 = time.perf_counter()
    with PeakMemory(device) as mem:
        trainer = Trainer(cfg, collective=group[0] if group is not None else None)
        trainer.fit()
        if device.type == "cuda":
            torch.cuda.synchronize()
    out["wall_s"] = time.perf_counter() - t0
    out["measured_bytes"] = int(mem.peak)
    out["predicted_bytes"] = (
        budget.peak_bytes("device") if device.type == "cuda" else budget.total_peak_bytes()
    )
    out["measured_over_predicted"] = out["measured_bytes"] / max(out["predicted_bytes"], 1)
    trainer.close()
    return out


def run_configs(
    device: str, preset: str, batch: int, steps: int, keys: list[str] | None = None, timeout: float = 600.0
) -> list[dict[str, Any]]:
    """Every configuration (or those in ``keys``), each in its own subprocess, in order."""
    rows: list[dict[str, Any]] = []
    for key, label, optimizer, strategy, outer in CONFIGS:
        if keys is not None and key not in keys:
            continue
        spec = {
            "device": device,
            "preset": preset,
            "batch": batch,
            "steps": steps,
            "optimizer": optimizer,
            "strategy": strategy,
            "outer": outer,
        }
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            cwd=str(HERE.parent),
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        if proc.returncode != 0 or not lines:
            res: dict[str, Any] = {"status": f"failed: exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
        else:
            res = json.loads(lines[-1])
        rows.append({"key": key, "label": label, **spec, **res})
        print(_row_line(rows[-1]), flush=True)
    return rows


def _row_line(r: dict[str, Any]) -> str:
    if "measured_bytes" not in r:
        pred = r.get("budget", {}).get(
            "total_peak_bytes" if r.get("device") == "cpu" else "peak_device_bytes"
        )
        p = f"{pred / MiB:8.1f}" if pred else "       -"
        return f"{r['label']:52s} {'-':>9s} {p} MiB predicted  {r['status']}"
    return (
        f"{r['label']:52s} {r['measured_bytes'] / MiB:9.1f} {r['predicted_bytes'] / MiB:8.1f} MiB predicted  "
        f"x{r['measured_over_predicted']:.2f}"
    )


def volunteer_16gb() -> dict[str, Any]:
    """Largest parameter count per configuration that fits a 16 GB card, from the budget alone."""
    from swarmtrain.app.models.presets import PRESETS
    from swarmtrain.app.train.memory_budget import activation_bytes, memory_budget

    act = activation_bytes(PRESETS[ACT_PRESET], ACT_BATCH, bf16=True)
    out: dict[str, Any] = {
        "device_bytes": VOLUNTEER_BYTES,
        "activation_allowance_bytes": act,
        "rule": (
            f"N_max = (15 GiB - activations of a {ACT_PRESET} micro-batch of {ACT_BATCH} in bf16) / "
            "device bytes per parameter (weights, grads, inner and outer state, residuals, the larger of "
            "the bf16 weight copies and the sync buffers), per-parameter figures of the gpt2-124m shapes"
        ),
        "configs": {},
    }
    for key, label, optimizer, strategy, outer in CONFIGS:
        cfg, _ = build_config(ACT_PRESET, ACT_BATCH, 10, "cuda", optimizer, strategy, outer, "/tmp/unused")
        b = memory_budget(cfg, "cuda")
        n = b.num_params
        comps = [c for c in b.components if c.where == "device"]
        persistent = sum(c.total_bytes for c in comps if c.phase == "persistent")
        grads = sum(c.total_bytes for c in comps if c.name == "grads")
        sync = sum(c.total_bytes for c in comps if c.phase == "sync")
        per_param = (persistent + grads + max(2 * n, sync)) / n  # bf16 weight copies vs sync buffers
        out["configs"][key] = {
            "label": label,
            "device_bytes_per_param": per_param,
            "max_params": int((VOLUNTEER_BYTES - act) / per_param),
        }
    base = out["configs"]["diloco_fp32"]["max_params"]
    for v in out["configs"].values():
        v["vs_fp32_diloco"] = v["max_params"] / base
    return out


def format_table(rows: list[dict[str, Any]], vol: dict[str, Any]) -> str:
    """The measured table and the 16 GB lines."""
    lines = [f"{'configuration':52s} {'peak MiB':>9s} {'budget':>8s}", *(_row_line(r) for r in rows), ""]
    lines.append("16 GB volunteer (budget arithmetic, activations of gpt2-124m x 8 held fixed):")
    for v in vol["configs"].values():
        lines.append(
            f"  {v['label']:52s} {v['device_bytes_per_param']:5.2f} B/param -> "
            f"{v['max_params'] / 1e6:7.0f}M params (x{v['vs_fp32_diloco']:.2f})"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4, help="trainer steps per configuration (H = 2)")
    ap.add_argument("--configs", default=None, help="comma-separated keys (default: all)")
    ap.add_argument("--out", default=None, help="JSON path (default: results/memory_<device>.json)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(measure_one(json.loads(args.worker))), flush=True)
        return
    from runlog import recorded, write_report  # type: ignore[import-not-found]

    keys = args.configs.split(",") if args.configs else None
    rows = run_configs(args.device, args.preset, args.batch_size, args.steps, keys)
    vol = volunteer_16gb()
    print()
    print(format_table(rows, vol))
    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    out = Path(args.out) if args.out else RESULTS / f"memory_{kind}.json"
    record = {
        "benchmark": "memory",
        "recorded": recorded(),
        "metric": "peak CUDA allocated bytes" if kind == "cuda" else "peak RSS growth (2 ms sampling)",
        "args": vars(args),
        "rows": rows,
        "volunteer_16gb": vol,
    }
    write_report(out, record, indent=1)


if __name__ == "__main__":
    main()
