"""The GPU measurements as one script (CPU too, at small sizes, so CI runs every piece).

Sections, in order of importance (a section that would start after ``--budget-s`` is skipped), each
reusing the project's own code, each with its goals and whether they were met:

1. ``strategies``: ``swarmtrain simulate --peers 2 --strategy S`` for data_parallel, diloco,
   streaming_diloco and demo, both peers on ``--device``: final validation loss, whether the peers
   end with identical parameters (the goal), bytes sent per peer (the peers' ledgers), wall time.
   One strategy's failure is recorded in its own row; the others still run.
2. ``codecs``: ``benchmarks/gpu_codecs.py``'s ``codec_section`` (int8 and ternary against the
   pinned D2H/H2D bound) when that file exists; else int8 and ternary throughput as a fraction of a
   device copy (``compression.benchmark.benchmark_codecs``; goal >= 0.7x on a GPU).
3. ``swarm``: ``swarmtrain simulate --strategy swarm --stages 2 --peers 2``: loss, identical stage
   replicas, no micro-batch lost, and the device each stage server's parameters were on
   (``server_devices`` of the run's JSON): the goal is every stage on ``--device``.
4. ``local_loop``: the Trainer vs a minimal loop (``benchmarks/local_loop.py``); on CUDA gpt2-124m
   compiled in bf16 at the largest batch the memory budget (``swarmtrain.app.train.memory_budget``) fits
   in a 24 GB card (23 GiB for the allocator, enforced with ``--mem-cap-gib``; one smaller retry on
   an out-of-memory error), with the model FLOPs utilisation
   ``(6 N + 12 L d T) * tokens/s / --peak-tflops`` (PaLM's count; Chowdhery et al. 2022), goal >= 45 %.
5. ``memory``: ``benchmarks/memory.py``'s configurations and its 16 GB arithmetic.
6. ``dct``: DeMo's chunked DCT and top-k extraction (``optimizers.dct``, ``optimizers.demo``) of
   one matrix, in GB/s of fp32 input and as a fraction of a copy.

Writes ``benchmarks/results/gpu_<device>.json`` after every section (``complete`` false until the
end, so a run killed by an outer ``timeout`` keeps what it measured) and prints a table of at most
80 columns. Real-peer runs are held under ``flock /tmp/swarmtrain-integration.lock`` when ``flock``
exists. Every subprocess is bounded by ``--hard-s`` (default ``--budget-s`` + 110 s).

    timeout 420 python benchmarks/gpu.py --device cuda --budget-s 280   # H100/H200: ~5-6 minutes
    python benchmarks/gpu.py --device cpu        # CI sizes, ~3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from gpu_common import Clock, goal, goals_met, run_bounded  # type: ignore[import-not-found]  # noqa: E402
from gpu_loop import local_loop  # type: ignore[import-not-found]  # noqa: E402
from gpu_table import SECTIONS, table  # type: ignore[import-not-found]  # noqa: E402

STRATEGIES = ("data_parallel", "diloco", "streaming_diloco", "demo")

# sizes per device kind: CUDA the goal workloads, CPU the smallest that exercise the code
SIZES: dict[str, dict[str, Any]] = {
    "cuda": {
        # batch None: the largest multiple of batch_step whose budget fits mem_cap_gib
        "loop": {
            "preset": "gpt2-124m",
            "batch": None,
            "batch_step": 8,
            "mem_cap_gib": 23.0,
            "steps": 30,
            "warmup": 10,
            "rounds": 1,
            "warm_pass": False,
        },  # fmt: skip
        "compile": [True],
        "mfu_goal": 0.45,
        "codec_numel": 1 << 26,
        "dct_shape": (4096, 4096),
        "sim": {"steps": 20, "H": 5, "batch": 8, "preset": "small", "timeout": 100},
        "swarm": {"steps": 16, "batch": 8, "preset": "small", "timeout": 120},
        "memory": {"preset": "gpt2-124m", "batch": 8, "steps": 4, "keys": None},
    },
    "cpu": {
        "loop": {"preset": "tiny", "batch": 2, "steps": 4, "warmup": 2, "rounds": 1, "warm_pass": True},
        "compile": [False],
        "mfu_goal": 0.45,
        "codec_numel": 1 << 20,
        "dct_shape": (512, 512),
        "sim": {"steps": 16, "H": 4, "batch": 2, "preset": "tiny", "timeout": 150},
        "swarm": {"steps": 12, "batch": 2, "preset": "tiny", "timeout": 150},
        "memory": {"preset": "tiny", "batch": 2, "steps": 2, "keys": ["diloco_fp32", "diloco_8bit_cpu8"]},
    },
}


def _simulate(args: list[str], device: str, timeout: float) -> tuple[dict[str, Any], float]:
    """``python -m swarmtrain simulate ARGS --json`` with the peers on ``device``: (JSON, wall s).

    Raises:
        RuntimeError: it exited non-zero without a JSON, or wrote none.
    """
    path = Path(tempfile.mkdtemp(prefix="swarmtrain-gpu-")) / "sim.json"
    cmd = [sys.executable, "-m", "swarmtrain", "simulate", *args]
    cmd += ["--json", str(path), "--timeout", str(max(int(timeout) - 20, 10))]
    if shutil.which("flock"):
        cmd = ["flock", "/tmp/swarmtrain-integration.lock", *cmd]
    env = {**os.environ, "SWARMTRAIN_TRAIN__DEVICE": device}
    t0 = time.perf_counter()
    code, err = run_bounded(cmd, timeout, env)
    wall = time.perf_counter() - t0
    if not path.exists():
        raise RuntimeError(f"simulate exited {code}: {err.strip()[-400:]}")
    rec = json.loads(path.read_text())
    rec["exit_code"] = code
    return rec, wall


def one_strategy(name: str, device: str, sim: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One strategy's 2-peer run: loss, identity, bytes per peer (ledger), wall."""
    args = ["--peers", "2", "--strategy", name, "--steps", str(sim["steps"])]
    args += ["--batch-size", str(sim["batch"]), "--preset", sim["preset"]]
    if name in ("diloco", "streaming_diloco"):
        args += ["-H", str(sim["H"])]
    rec, wall = _simulate(args, device, timeout)
    return {
        "status": "measured",
        "compressor": rec.get("compressor"),
        "final_val_loss": rec.get("final_val_loss"),
        "params_identical": rec.get("params_identical"),
        "bytes_sent_per_peer": rec.get("bytes_sent_per_peer"),
        "rounds_committed": rec.get("rounds_committed"),
        "rounds_failed": rec.get("rounds_failed"),
        "run_wall_s": rec.get("wall_s"),
        "wall_s": wall,
        "exit_code": rec["exit_code"],
    }


def strategies(device: str, sizes: dict[str, Any], clock: Clock) -> dict[str, Any]:
    """Every data-parallel strategy with 2 real peers on ``device``, each failure on its own row."""
    sim = sizes["sim"]
    runs: dict[str, dict[str, Any]] = {}
    for name in STRATEGIES:
        if clock.spent():
            runs[name] = {"status": f"skipped: time budget spent ({clock.elapsed():.0f} s)"}
            continue
        try:
            runs[name] = one_strategy(name, device, sim, clock.left(sim["timeout"]))
        except Exception as e:  # one failing strategy must not hide the others
            runs[name] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
        print(f"  {name}: {runs[name]['status']}", flush=True)
    goals = {f"{n}_identical": goal(True, r.get("params_identical")) for n, r in runs.items()}
    for n in STRATEGIES:  # a strategy that did not run misses its goal
        if runs[n]["status"] != "measured":
            goals[f"{n}_identical"]["met"] = False
    return {
        "peers": 2,
        "device": device,
        "preset": sim["preset"],
        "steps": sim["steps"],
        "inner_steps": sim["H"],
        "batch": sim["batch"],
        "runs": runs,
        "goals": goals,
        "goals_met": goals_met(goals),
    }


def swarm(device: str, sizes: dict[str, Any], clock: Clock) -> dict[str, Any]:
    """SWARM with 2 stages of one server each and 1 trainer, the servers on ``device``."""
    sw = sizes["swarm"]
    args = ["--strategy", "swarm", "--stages", "2", "--peers", "2", "--steps", str(sw["steps"])]
    args += ["--batch-size", str(sw["batch"]), "--preset", sw["preset"]]
    rec, wall = _simulate(args, device, clock.left(sw["timeout"]))
    devices: dict[str, Any] = rec.get("server_devices") or {}
    kind = device.split(":")[0]
    on_device = bool(devices) and all(str(d).split(":")[0] == kind for d in devices.values())
    goals = {
        "stages_on_device": goal(True, on_device if devices else None),
        "replicas_identical": goal(True, rec.get("params_identical")),
        "no_lost_microbatches": goal(0, rec.get("lost_microbatches"), higher=False),
    }
    return {
        "device": device,
        "preset": sw["preset"],
        "microbatches": sw["steps"],
        "batch": sw["batch"],
        "server_devices": devices,
        "final_val_loss": rec.get("final_val_loss"),
        "params_identical": rec.get("params_identical"),
        "lost_microbatches": rec.get("lost_microbatches"),
        "samples_per_s": rec.get("throughput_samples_per_s"),
        "bytes_sent_per_peer": rec.get("bytes_sent_per_peer"),
        "run_wall_s": rec.get("wall_s"),
        "wall_s": wall,
        "exit_code": rec["exit_code"],
        "goals": goals,
        "goals_met": goals_met(goals),
    }


def codecs(device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """``benchmarks/gpu_codecs.py``'s section when it exists (and works); else the copy roofline."""
    why = "benchmarks/gpu_codecs.py is missing"
    try:
        from gpu_codecs import codec_section  # type: ignore[import-not-found]
    except Exception as e:  # missing, or broken: this script must run either way
        if (HERE / "gpu_codecs.py").exists():
            why = f"benchmarks/gpu_codecs.py did not import: {type(e).__name__}: {e}"
    else:
        try:
            res = dict(codec_section(device, sizes))
        except Exception as e:
            why = f"gpu_codecs.codec_section failed: {type(e).__name__}: {e}"
        else:
            if not isinstance(res.get("goals"), dict):
                res["goals"] = codec_goals(res, device.startswith("cuda"))
            res.setdefault("goals_met", goals_met(res["goals"]))
            return {"source": "benchmarks/gpu_codecs.py", **res}
    fallback = codecs_copy(device, sizes)
    return {"source": "compression.benchmark (copy roofline)", "fallback_reason": why, **fallback}


def codec_goals(res: dict[str, Any], cuda: bool) -> dict[str, dict[str, Any]]:
    """Goals from ``gpu_codecs``' figures: per codec and way, GB/s and the fraction of the pinned
    bound (GPU goals: ``met`` is ``None`` on the CPU), and the result identical to the CPU's."""
    goals: dict[str, dict[str, Any]] = {}
    for name, c in (res.get("codecs") or {}).items():
        if not isinstance(c, dict):
            continue
        for way in ("compress", "decompress"):
            w = c.get(way) if isinstance(c.get(way), dict) else {}
            goals[f"{name}_{way}_gbps"] = goal(res.get("goal_gbps", 100.0), w.get("gbps"), applies=cuda)
            frac = goal(res.get("goal_fraction", 0.7), w.get("fraction"), applies=cuda)
            goals[f"{name}_{way}_fraction_of_bound"] = frac
        if "identical_to_cpu" in c:
            goals[f"{name}_identical_to_cpu"] = goal(True, c["identical_to_cpu"])
    return goals


def codecs_copy(device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """int8 and ternary against a device copy (``none`` for reference); goal >= 0.7x on a GPU."""
    from compression.benchmark import benchmark_codecs

    res = benchmark_codecs(sizes["codec_numel"], ["none", "int8", "ternary"], reps=3, device=device)
    results = {
        r.codec: {
            "compress_gbps": r.compress_gbps,
            "decompress_gbps": r.decompress_gbps,
            "compress_roofline": r.compress_roofline,
            "decompress_roofline": r.decompress_roofline,
            "rel_l2_error": r.rel_l2_error,
        }
        for r in res
    }
    cuda = device.startswith("cuda")
    goals = {
        f"{c}_{way}_roofline": goal(0.7, results.get(c, {}).get(f"{way}_roofline"), applies=cuda)
        for c in ("int8", "ternary")
        for way in ("compress", "decompress")
    }
    return {"numel": sizes["codec_numel"], "results": results, "goals": goals, "goals_met": goals_met(goals)}


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
    goals = {"roundtrip_rel_error": goal(1e-4, err, higher=False)}
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
        "goals": goals,
        "goals_met": goals_met(goals),
    }


def memory(device: str, sizes: dict[str, Any], clock: Clock) -> dict[str, Any]:
    """``benchmarks/memory.py``: measured peaks vs the budget (goal: within it), the 16 GB arithmetic."""
    import memory as mem  # benchmarks/memory.py

    m = sizes["memory"]
    cuda = device.startswith("cuda")
    rows = mem.run_configs(device, m["preset"], m["batch"], m["steps"], m["keys"], timeout=clock.left(300))
    goals = {
        f"{r['key']}_within_budget": goal(1.0, r.get("measured_over_predicted"), higher=False, applies=cuda)
        for r in rows
    }  # on the CPU the figure is RSS growth, which the device budget does not bound
    return {
        "preset": m["preset"],
        "rows": rows,
        "volunteer_16gb": mem.volunteer_16gb(),
        "goals": goals,
        "goals_met": goals_met(goals),
    }


def write(record: dict[str, Any], out: Path) -> None:
    """The JSON as it stands (no NaN: ``None`` instead), written whole (temporary file, rename)."""
    from runlog import finite  # type: ignore[import-not-found]

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(finite(record), indent=1, default=list, allow_nan=False) + "\n")
    tmp.replace(out)


def run_sections(
    runs: dict[str, Callable[[], dict[str, Any]]],
    wanted: set[str],
    clock: Clock,
    sections: dict[str, dict[str, Any]],
    on_done: Callable[[], None],
) -> None:
    """Each section in order into ``sections``, a failure recorded (the others go on); ``on_done``
    after each (the JSON so far)."""
    for name in SECTIONS:
        if name not in wanted:
            sections[name] = {"status": "skipped: not in --sections"}
            continue
        if clock.spent():
            sections[name] = {"status": f"skipped: time budget spent ({clock.elapsed():.0f} s)"}
            continue
        t0 = time.perf_counter()
        print(f"{name}: running ({clock.elapsed():.0f} s in)", flush=True)
        try:
            sections[name] = {"status": "measured", **runs[name]()}
        except Exception as e:  # one failing piece must not lose the others' figures
            sections[name] = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:2000]}
        sections[name]["section_s"] = time.perf_counter() - t0
        print(f"{name}: {sections[name]['status']} ({sections[name]['section_s']:.1f} s)", flush=True)
        on_done()


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    ap.add_argument("--budget-s", type=float, default=450.0, help="no section starts after this many seconds")
    ap.add_argument("--hard-s", type=float, default=None, help="subprocesses end by then [budget + 110]")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak for MFU (H100/H200)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset")
    ap.add_argument("--out", default=None, help="JSON path (default: results/gpu_<device>.json)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    import torch
    from runlog import recorded  # type: ignore[import-not-found]

    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: CUDA is not available here (use --device cpu)")
    sizes = SIZES[kind]
    clock = Clock(args.budget_s, args.hard_s if args.hard_s is not None else args.budget_s + 110.0)
    out = Path(args.out) if args.out else HERE / "results" / f"gpu_{kind}.json"
    dev = args.device
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "strategies": lambda: strategies(dev, sizes, clock),
        "codecs": lambda: codecs(dev, sizes),
        "swarm": lambda: swarm(dev, sizes, clock),
        "local_loop": lambda: local_loop(dev, sizes, args.peak_tflops, clock),
        "memory": lambda: memory(dev, sizes, clock),
        "dct": lambda: dct(dev, sizes),
    }
    record: dict[str, Any] = {
        "benchmark": "gpu",
        "recorded": recorded(),
        "device": dev,
        "device_name": torch.cuda.get_device_name(dev) if kind == "cuda" else "cpu",
        "torch": torch.__version__,
        "budget_s": args.budget_s,
        "hard_s": clock.hard_s,
        "complete": False,
        "sizes": sizes,
        "sections": {},
    }

    def save() -> None:
        record["total_s"] = clock.elapsed()
        write(record, out)

    run_sections(runs, set(args.sections.split(",")), clock, record["sections"], save)
    record["complete"] = True
    record["goals_met"] = {n: s.get("goals_met") for n, s in record["sections"].items()}
    save()
    print()
    print(table(record))
    print(f"total {record['total_s']:.0f} s")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
