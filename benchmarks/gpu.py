"""The GPU measurements as one script (CPU too, at small sizes, so CI runs every piece).

Sections, each reusing the project's own benchmark code, in one process tree and one time budget:

1. ``local_loop``: the Trainer vs a minimal loop (``benchmarks/local_loop.py``), without and with
   ``torch.compile``; goal >= 0.95x; on CUDA the model FLOPs utilisation
   (``(6 N + 12 L d T) * tokens/s / --peak-tflops``, PaLM's count; Chowdhery et al. 2022).
2. ``codecs``: int8 and ternary throughput as a fraction of a device copy
   (``compression.benchmark.benchmark_codecs``); goal >= 0.7x on a GPU.
3. ``dct``: DeMo's chunked DCT and top-k extraction (``optimizers.dct``, ``optimizers.demo``) of
   one matrix, in GB/s of fp32 input and as a fraction of a copy.
4. ``diloco_2proc``: ``swarmtrain simulate --peers 2`` (DiLoCo, int8): two real peer processes
   sharing the device; final loss, identity, wall time (under ``flock
   /tmp/swarmtrain-integration.lock`` when ``flock`` exists).
5. ``memory``: ``benchmarks/memory.py``'s configurations and its 16 GB arithmetic.

Writes ``benchmarks/results/gpu_<device>.json`` and prints a table. A section that would start after
``--budget-s`` is recorded as skipped; a failed one records its error and the script goes on.

    python benchmarks/gpu.py --device cuda       # H100/H200: ~6-7 minutes
    python benchmarks/gpu.py --device cpu        # CI sizes, ~1-2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
SECTIONS = ("local_loop", "codecs", "dct", "diloco_2proc", "memory")

# sizes per device kind: CUDA the goal workloads, CPU the smallest that exercise the code
SIZES: dict[str, dict[str, Any]] = {
    "cuda": {
        "loop": {"preset": "gpt2-124m", "batch": 8, "steps": 30, "warmup": 10, "rounds": 3},
        "compile": [False, True],
        "codec_numel": 1 << 26,
        "dct_shape": (4096, 4096),
        "sim": {"steps": 60, "H": 20, "batch": 16, "preset": "small"},
        "memory": {"preset": "gpt2-124m", "batch": 8, "steps": 4, "keys": None},
    },
    "cpu": {
        "loop": {"preset": "tiny", "batch": 2, "steps": 4, "warmup": 2, "rounds": 1},
        "compile": [False],
        "codec_numel": 1 << 20,
        "dct_shape": (512, 512),
        "sim": {"steps": 6, "H": 3, "batch": 2, "preset": "tiny"},
        "memory": {"preset": "tiny", "batch": 2, "steps": 2, "keys": ["diloco_fp32", "diloco_8bit_cpu8"]},
    },
}


def local_loop(device: str, sizes: dict[str, Any], peak_tflops: float) -> dict[str, Any]:
    """Trainer / minimal loop, per compile setting, through ``benchmarks/local_loop.py``."""
    from swarmtrain.app.models.presets import PRESETS

    lp = sizes["loop"]
    spec = PRESETS[lp["preset"]]
    flops_per_token = 6 * spec.num_params() + 12 * spec.n_layer * spec.n_embd * spec.block_size
    out: dict[str, Any] = {"preset": lp["preset"], "batch": lp["batch"], "goal": 0.95, "runs": {}}
    for compile_ in (False, True):
        key = "compile" if compile_ else "eager"
        if compile_ not in sizes["compile"]:
            out["runs"][key] = {"status": "skipped on cpu: the compile warm-up exceeds the CI budget"}
            continue
        path = Path(tempfile.mkdtemp(prefix="swarmtrain-gpu-")) / "loop.json"
        cmd = [
            sys.executable, str(HERE / "local_loop.py"), "--device", device, "--preset", lp["preset"],
            "--batch-size", str(lp["batch"]), "--steps", str(lp["steps"]), "--warmup", str(lp["warmup"]),
            "--rounds", str(lp["rounds"]), "--out", str(path),
        ]  # fmt: skip
        if device == "cpu":
            cmd += ["--threads", "1"]
        if compile_:
            cmd.append("--compile")
        subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
        rec = json.loads(path.read_text())
        trainer_tps = rec["summary"]["trainer"]["tokens_per_s_median"]
        run = {
            "status": "measured",
            "ratio_trainer_over_minimal": rec["ratio_trainer_over_minimal"],
            "cpu_time_ratio": rec["cpu_time_ratio_trainer_over_minimal"],
            "trainer_tokens_per_s": trainer_tps,
            "minimal_tokens_per_s": rec["summary"]["minimal"]["tokens_per_s_median"],
            "peak_mem_bytes_trainer": rec["summary"]["trainer"]["peak_mem_bytes_median"],
            "mfu": flops_per_token * trainer_tps / (peak_tflops * 1e12)
            if device.startswith("cuda")
            else None,
        }
        out["runs"][key] = run
    out["flops_per_token"] = flops_per_token
    out["peak_tflops"] = peak_tflops if device.startswith("cuda") else None
    return out


def codecs(device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """int8 and ternary against a device copy (``none`` for reference)."""
    from compression.benchmark import benchmark_codecs

    res = benchmark_codecs(sizes["codec_numel"], ["none", "int8", "ternary"], reps=3, device=device)
    return {
        "numel": sizes["codec_numel"],
        "goal_roofline": 0.7,
        "results": {
            r.codec: {
                "compress_gbps": r.compress_gbps,
                "decompress_gbps": r.decompress_gbps,
                "compress_roofline": r.compress_roofline,
                "decompress_roofline": r.decompress_roofline,
                "rel_l2_error": r.rel_l2_error,
            }
            for r in res
        },
    }


def _best(fn: Callable[[], object], device: str, reps: int = 5) -> float:
    import torch

    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


def dct(device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """DeMo's extraction of one matrix: chunked DCT, top-k per chunk, and the inverse, vs a copy."""
    import torch

    from optimizers.dct import ChunkedDCT
    from optimizers.demo import demo_extract

    shape = tuple(sizes["dct_shape"])
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(device)
    dst = torch.empty_like(x)
    t = ChunkedDCT(shape, 64)
    coeffs = t.encode(x)
    k = 8

    def extract() -> object:
        return demo_extract(t.encode(x), k)

    extract()  # warm-up (kernels, cached DCT matrices)
    copy_s = _best(lambda: dst.copy_(x), device)
    enc_s = _best(lambda: t.encode(x), device)
    ext_s = _best(extract, device)
    dec_s = _best(lambda: t.decode(coeffs), device)
    nbytes = x.numel() * 4
    err = float((t.decode(coeffs) - x).norm() / x.norm())
    return {
        "shape": list(shape),
        "chunk": 64,
        "topk": k,
        "copy_gbps": 2 * nbytes / copy_s / 1e9,
        "encode_gbps": nbytes / enc_s / 1e9,
        "extract_gbps": nbytes / ext_s / 1e9,
        "decode_gbps": nbytes / dec_s / 1e9,
        "extract_over_copy_time": copy_s / ext_s,
        "roundtrip_rel_error": err,
    }


def diloco_2proc(device: str, sizes: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``swarmtrain simulate --peers 2`` (DiLoCo, int8) with both peers on ``device``."""
    sim = sizes["sim"]
    path = Path(tempfile.mkdtemp(prefix="swarmtrain-gpu-")) / "sim.json"
    exe = shutil.which("swarmtrain") or str(Path(sys.executable).parent / "swarmtrain")
    cmd = [
        exe, "simulate", "--peers", "2", "--strategy", "diloco", "--compressor", "int8",
        "--steps", str(sim["steps"]), "-H", str(sim["H"]), "--batch-size", str(sim["batch"]),
        "--preset", sim["preset"], "--json", str(path), "--timeout", str(max(int(timeout), 10)),
    ]  # fmt: skip
    if shutil.which("flock"):
        cmd = ["flock", "/tmp/swarmtrain-integration.lock", *cmd]
    env = {**os.environ, "SWARMTRAIN_TRAIN__DEVICE": device}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout + 60)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not path.exists():
        raise RuntimeError(f"simulate exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    rec = json.loads(path.read_text())
    return {
        "peers": 2,
        "preset": sim["preset"],
        "steps": sim["steps"],
        "inner_steps": sim["H"],
        "wall_s": wall,
        "final_val_loss": rec.get("final_val_loss", rec.get("val_loss")),
        "params_identical": rec.get("params_identical"),
        "simulate": {k: v for k, v in rec.items() if isinstance(v, int | float | str | bool) or v is None},
    }


def memory(device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """``benchmarks/memory.py``: measured peaks vs the budget, and the 16 GB arithmetic."""
    import memory as mem  # benchmarks/memory.py

    m = sizes["memory"]
    rows = mem.run_configs(device, m["preset"], m["batch"], m["steps"], m["keys"])
    return {"preset": m["preset"], "rows": rows, "volunteer_16gb": mem.volunteer_16gb()}


def _table(record: dict[str, Any]) -> str:
    lines = [f"{'section':14s} {'status':10s} figures"]
    for name in SECTIONS:
        sec = record["sections"][name]
        status = sec.get("status", "?")
        fig = ""
        if status == "measured" and name == "local_loop":
            fig = ", ".join(
                f"{k}: x{v['ratio_trainer_over_minimal']:.3f}"
                + (f" MFU {v['mfu']:.1%}" if v.get("mfu") is not None else "")
                for k, v in sec["runs"].items()
                if v.get("status") == "measured"
            )
        elif status == "measured" and name == "codecs":
            fig = ", ".join(f"{k} {v['compress_roofline']:.2f}" for k, v in sec["results"].items())
        elif status == "measured" and name == "dct":
            fig = f"extract {sec['extract_gbps']:.2f} GB/s ({sec['extract_over_copy_time']:.3f} of a copy)"
        elif status == "measured" and name == "diloco_2proc":
            loss, same = sec["final_val_loss"], sec["params_identical"]
            fig = f"val loss {loss}, identical {same}, {sec['wall_s']:.0f} s"
        elif status == "measured" and name == "memory":
            fig = ", ".join(
                f"{r['key']} {r['measured_bytes'] / 2**20:.0f} MiB "
                f"(budget x{r['measured_over_predicted']:.2f})"
                for r in sec["rows"]
                if "measured_bytes" in r
            )
        else:
            fig = sec.get("error", "")[:120]
        lines.append(f"{name:14s} {status:10s} {fig}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--budget-s", type=float, default=450.0, help="no section starts after this many seconds")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100/H200)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset")
    ap.add_argument("--out", default=None, help="JSON path (default: results/gpu_<device>.json)")
    args = ap.parse_args()
    import torch
    from runlog import finite, recorded  # type: ignore[import-not-found]

    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: CUDA is not available here (use --device cpu)")
    sizes = SIZES[kind]
    wanted = set(args.sections.split(","))
    t_start = time.perf_counter()
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "local_loop": lambda: local_loop(args.device, sizes, args.peak_tflops),
        "codecs": lambda: codecs(args.device, sizes),
        "dct": lambda: dct(args.device, sizes),
        "diloco_2proc": lambda: diloco_2proc(args.device, sizes, args.budget_s),
        "memory": lambda: memory(args.device, sizes),
    }
    sections: dict[str, dict[str, Any]] = {}
    for name in SECTIONS:
        elapsed = time.perf_counter() - t_start
        if name not in wanted:
            sections[name] = {"status": "skipped: not in --sections"}
            continue
        if elapsed > args.budget_s:
            sections[name] = {"status": f"skipped: time budget spent ({elapsed:.0f} s)"}
            continue
        t0 = time.perf_counter()
        try:
            sections[name] = {"status": "measured", **runs[name]()}
        except Exception as e:  # one failing piece must not lose the others' figures
            sections[name] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
        sections[name]["section_s"] = time.perf_counter() - t0
        print(f"{name}: {sections[name]['status']} ({sections[name]['section_s']:.1f} s)", flush=True)
    record = {
        "benchmark": "gpu",
        "recorded": recorded(),
        "device": args.device,
        "device_name": torch.cuda.get_device_name(args.device) if kind == "cuda" else "cpu",
        "torch": torch.__version__,
        "total_s": time.perf_counter() - t_start,
        "sizes": {k: v for k, v in sizes.items()},
        "sections": sections,
    }
    record = finite(record)
    print()
    print(_table(record))
    print(f"total {record['total_s']:.0f} s")
    out = Path(args.out) if args.out else HERE / "results" / f"gpu_{kind}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=list) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
