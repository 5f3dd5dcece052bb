"""``benchmarks/gpu.py``'s ``local_loop`` section: the Trainer against a minimal loop
(``benchmarks/local_loop.py``), on CUDA at the largest batch the memory budget fits, with the MFU."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from gpu_common import Clock, GiB, goal, goals_met, run_bounded  # type: ignore[import-not-found]

HERE = Path(__file__).resolve().parent

__all__ = ["loop_batch", "local_loop"]


def loop_batch(lp: dict[str, Any]) -> tuple[int, int | None]:
    """``(batch, predicted device bytes)``: the fixed batch, or the largest multiple of
    ``batch_step`` whose memory budget (compiled, bf16, no strategy) fits ``mem_cap_gib``."""
    if lp.get("batch"):
        return int(lp["batch"]), None
    from swarmtrain.app.train.memory_budget import memory_budget
    from swarmtrain.core.config import load_config

    cap, step = lp["mem_cap_gib"] * GiB, lp["batch_step"]
    best: tuple[int, int | None] = (step, None)
    for b in range(step, 1025, step):
        over = {"model.preset": lp["preset"], "train.batch_size": b, "train.compile": True}
        cfg = load_config(env={}, overrides={**over, "train.device": "cuda", "strategy.name": "local"})
        peak = memory_budget(cfg, "cuda").peak_bytes("device")
        if peak > cap:
            break
        best = (b, peak)
    return best


def _run_loop(device: str, lp: dict[str, Any], batch: int, compile_: bool, timeout: float) -> dict[str, Any]:
    """``benchmarks/local_loop.py`` once; its JSON record.

    Raises:
        RuntimeError: it failed (``out of memory`` in the message when it ran out of memory).
    """
    path = Path(tempfile.mkdtemp(prefix="swarmtrain-gpu-")) / "loop.json"
    cmd = [
        sys.executable, str(HERE / "local_loop.py"), "--device", device, "--preset", lp["preset"],
        "--batch-size", str(batch), "--steps", str(lp["steps"]), "--warmup", str(lp["warmup"]),
        "--rounds", str(lp["rounds"]), "--out", str(path),
    ]  # fmt: skip
    if device == "cpu":
        cmd += ["--threads", "1"]
    if lp.get("mem_cap_gib") and device.startswith("cuda"):
        cmd += ["--mem-cap-gib", str(lp["mem_cap_gib"])]
    if not lp.get("warm_pass", True):
        cmd.append("--no-warm-pass")
    if compile_:
        cmd.append("--compile")
    code, err = run_bounded(cmd, timeout)
    if code != 0 or not path.exists():
        oom = "out of memory" if "OutOfMemoryError" in err or "out of memory" in err else ""
        raise RuntimeError(f"local_loop.py exited {code} {oom}: {err.strip()[-400:]}")
    return json.loads(path.read_text())


def _loop_run(rec: dict[str, Any], batch: int, flops_per_token: float, peak: float | None) -> dict[str, Any]:
    s = rec["summary"]
    tps, mtps = s["trainer"]["tokens_per_s_median"], s["minimal"]["tokens_per_s_median"]
    return {
        "status": "measured",
        "batch": batch,
        "ratio_trainer_over_minimal": rec["ratio_trainer_over_minimal"],
        "cpu_time_ratio": rec["cpu_time_ratio_trainer_over_minimal"],
        "trainer_tokens_per_s": tps,
        "minimal_tokens_per_s": mtps,
        "peak_mem_bytes_trainer": s["trainer"]["peak_mem_bytes_median"],
        "peak_mem_bytes_minimal": s["minimal"]["peak_mem_bytes_median"],
        "mfu": flops_per_token * tps / (peak * 1e12) if peak else None,
        "mfu_minimal": flops_per_token * mtps / (peak * 1e12) if peak else None,
    }


def _loop_with_retry(
    device: str, lp: dict[str, Any], batch: int, compile_: bool, clock: Clock
) -> tuple[dict[str, Any], int, list[str]]:
    """Run at ``batch``; on an out-of-memory error once more at 3/4 of it (rounded to the step)."""
    errors: list[str] = []
    for _ in range(2):
        try:
            return _run_loop(device, lp, batch, compile_, clock.left()), batch, errors
        except RuntimeError as e:
            errors.append(f"batch {batch}: {e}")
            step = int(lp.get("batch_step", 1))
            smaller = max(step, (batch * 3 // 4) // step * step)
            if "out of memory" not in str(e) or smaller >= batch or clock.spent():
                raise
            batch = smaller
    raise RuntimeError("; ".join(errors))


def local_loop(device: str, sizes: dict[str, Any], peak_tflops: float, clock: Clock) -> dict[str, Any]:
    """Trainer / minimal loop per compile setting; on CUDA the MFU at the largest batch that fits."""
    from swarmtrain.app.models.presets import PRESETS

    lp = sizes["loop"]
    spec = PRESETS[lp["preset"]]
    flops_per_token = 6 * spec.num_params() + 12 * spec.n_layer * spec.n_embd * spec.block_size
    cuda = device.startswith("cuda")
    batch, predicted = loop_batch(lp)
    cap = lp.get("mem_cap_gib") if cuda else None
    out: dict[str, Any] = {"preset": lp["preset"], "bf16": cuda, "batch_chosen": batch, "runs": {}}
    out.update({"predicted_peak_bytes": predicted, "mem_cap_bytes": int(cap * GiB) if cap else None})
    for compile_ in (False, True):
        key = "compile" if compile_ else "eager"
        if compile_ not in sizes["compile"]:
            out["runs"][key] = {"status": f"skipped on {device.split(':')[0]}: not in this device's sizes"}
            continue
        rec, used, errors = _loop_with_retry(device, lp, batch, compile_, clock)
        out["runs"][key] = _loop_run(rec, used, flops_per_token, peak_tflops if cuda else None)
        out["runs"][key]["retries"] = errors
    out.update({"flops_per_token": flops_per_token, "peak_tflops": peak_tflops if cuda else None})
    out["goals"] = _loop_goals(out, sizes["mfu_goal"], cuda)
    out["goals_met"] = goals_met(out["goals"])
    return out


def _loop_goals(out: dict[str, Any], mfu_goal: float, cuda: bool) -> dict[str, dict[str, Any]]:
    """MFU >= the goal compiled in bf16 (CUDA), the batch within the cap, the Trainer >= 0.95x."""
    runs = out["runs"]
    best = runs.get("compile") if runs.get("compile", {}).get("status") == "measured" else runs.get("eager")
    best = best or {}
    peak = best.get("peak_mem_bytes_trainer")
    cap = out.get("mem_cap_bytes")
    return {
        "mfu_compiled_bf16": goal(mfu_goal, runs.get("compile", {}).get("mfu"), applies=cuda),
        "fits_24gb": goal(True, None if peak is None or cap is None else peak <= cap, applies=cuda),
        "trainer_over_minimal": goal(0.95, best.get("ratio_trainer_over_minimal")),
    }
