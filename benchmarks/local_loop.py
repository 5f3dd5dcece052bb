"""Local-loop overhead: the swarmtrain Trainer vs a minimal hand-written training loop.

Both run the same model, batches (the same sampler), optimizer (AdamW, weight decay on matrices),
gradient clipping, dtype and compile setting, alternating in one process for ``--rounds`` rounds;
the first ``--warmup`` steps of each phase are not timed, and one short untimed pass of each
comes first. Prints tokens/s and peak memory of both
and their ratio, and writes JSON to ``benchmarks/results/local_loop_<device>.json``.

Throughput is reported per wall-clock second and per CPU second of the training thread
(``time.thread_time``); on a shared CPU machine run with ``--threads 1`` and trust the CPU-time ratio,
since other processes' load moves wall-clock figures by tens of percent between rounds.

Peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the peak resident set size above
the phase's starting RSS, sampled every 2 ms by a thread (psutil).

    python benchmarks/local_loop.py --preset tiny --steps 30 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

from swarmtrain import __version__
from swarmtrain.app.data import BatchSampler, build_corpus
from swarmtrain.app.models import build_model, resolve_spec
from swarmtrain.app.train.trainer import StepInfo, Trainer, resolve_device
from swarmtrain.core.config import Config, load_config

RESULTS = Path(__file__).resolve().parent / "results"


class PeakMemory:
    """Peak memory of a code region: CUDA allocator peak, or sampled RSS above the starting RSS."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return self
        base = self._proc.memory_info().rss

        def sample() -> None:
            while not self._stop.is_set():
                self.peak = max(self.peak, self._proc.memory_info().rss - base)
                time.sleep(0.002)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_trainer(cfg: Config, steps: int, warmup: int) -> dict[str, float]:
    """Time ``Trainer.fit`` (metrics, hooks and all) between the end of step ``warmup`` and the last."""
    trainer = Trainer(cfg)
    stamps: list[tuple[float, float]] = []

    def on_step(info: StepInfo) -> None:
        if info.step == warmup or info.step == steps:
            _sync(trainer.device)
        stamps.append((time.perf_counter(), time.thread_time()))

    with PeakMemory(trainer.device) as mem:
        trainer.fit(on_step)
    tokens = (steps - warmup) * trainer.tokens_per_step
    return {
        "tokens_per_s": tokens / (stamps[steps - 1][0] - stamps[warmup - 1][0]),
        "tokens_per_cpu_s": tokens / (stamps[steps - 1][1] - stamps[warmup - 1][1]),
        "peak_mem_bytes": mem.peak,
    }


def run_minimal(cfg: Config, steps: int, warmup: int) -> dict[str, float]:
    """The loop a researcher writes by hand: forward, backward, clip, AdamW step, zero grads."""
    tc = cfg.train
    device = resolve_device(tc.device)
    corpus = build_corpus(cfg.data)
    model = build_model(cfg.model, seed=tc.seed).to(device)
    sampler = BatchSampler(corpus.train, batch_size=tc.batch_size, block_size=model.block_size, seed=tc.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay}, {"params": other, "weight_decay": 0.0}],
        lr=tc.lr,
        betas=(tc.beta1, tc.beta2),
        fused=device.type == "cuda",
    )
    fwd: Callable[..., Any] = torch.compile(model) if tc.compile else model
    amp = device.type == "cuda" and tc.bf16 != "off" and torch.cuda.is_bf16_supported()
    t_start = c_start = 0.0
    with PeakMemory(device) as mem:
        for step in range(steps):
            if step == warmup:
                _sync(device)
                t_start, c_start = time.perf_counter(), time.thread_time()
            x, y = sampler.get(step)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                _, loss = fwd(x, y)
            loss.backward()
            if tc.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        _sync(device)
        dt, dc = time.perf_counter() - t_start, time.thread_time() - c_start
    tokens = (steps - warmup) * tc.batch_size * model.block_size
    return {"tokens_per_s": tokens / dt, "tokens_per_cpu_s": tokens / dc, "peak_mem_bytes": mem.peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=30, help="steps per phase, warmup included")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="alternating trainer/minimal rounds")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--mem-cap-gib", type=float, default=None, help="CUDA: allocator cap in GiB (OOM beyond)")
    ap.add_argument(
        "--no-warm-pass", action="store_true", help="no untimed first pass (--warmup still untimed)"
    )
    ap.add_argument("--out", default=None, help="JSON path (default: results/local_loop_<device>.json)")
    args = ap.parse_args()
    if not 1 <= args.warmup < args.steps:
        ap.error("need 1 <= --warmup < --steps")
    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = tempfile.mkdtemp(prefix="swarmtrain-bench-")
    cfg = load_config(
        env={},
        overrides={
            "model.preset": args.preset,
            "train.steps": args.steps,
            "train.batch_size": args.batch_size,
            "train.device": args.device,
            "train.compile": args.compile,
            "train.eval_interval": 10 * args.steps,  # no evaluation inside the timed steps
            "train.progress": False,
            "train.out_dir": tmp,
        },
    )
    device = resolve_device(args.device)
    if args.mem_cap_gib is not None and device.type == "cuda":  # what fits a smaller card, enforced
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(
            min(1.0, args.mem_cap_gib * 2**30 / total), torch.device("cuda", device.index or 0)
        )
    rows: list[dict[str, Any]] = []
    if not args.no_warm_pass:
        # one untimed short pass of each first: one-time allocations and (with --compile) compilation
        run_trainer(
            cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": args.warmup + 1})}),
            args.warmup + 1,
            args.warmup,
        )
        run_minimal(cfg, args.warmup + 1, args.warmup)
    for r in range(args.rounds):
        order = ("trainer", "minimal") if r % 2 == 0 else ("minimal", "trainer")  # cancel drift
        for name in order:
            fn = run_trainer if name == "trainer" else run_minimal
            res = fn(cfg, args.steps, args.warmup)
            rows.append({"round": r, "loop": name, **res})
            mib = res["peak_mem_bytes"] / 2**20
            print(
                f"round {r} {name:8s} {res['tokens_per_s']:>10,.0f} tok/s  "
                f"{res['tokens_per_cpu_s']:>10,.0f} tok/cpu-s  {mib:8.1f} MiB"
            )
    summary: dict[str, dict[str, float]] = {}
    for name in ("trainer", "minimal"):
        mine = [x for x in rows if x["loop"] == name]
        summary[name] = {
            f"{k}_median": statistics.median(x[k] for x in mine)
            for k in ("tokens_per_s", "tokens_per_cpu_s", "peak_mem_bytes")
        }

    def ratios(key: str) -> tuple[float, list[float]]:
        def one(r: int, loop: str) -> float:
            return float(next(x for x in rows if x["round"] == r and x["loop"] == loop)[key])

        overall = summary["trainer"][f"{key}_median"] / summary["minimal"][f"{key}_median"]
        return overall, [one(r, "trainer") / one(r, "minimal") for r in range(args.rounds)]

    wall_ratio, wall_rounds = ratios("tokens_per_s")
    cpu_ratio, cpu_rounds = ratios("tokens_per_cpu_s")
    mem_label = "peak CUDA alloc" if device.type == "cuda" else "peak RSS growth"
    print()
    print(f"{'loop':10s} {'tok/s (median)':>16s} {'tok/cpu-s (median)':>20s} {mem_label + ' MiB':>22s}")
    for name in ("trainer", "minimal"):
        m = summary[name]
        print(
            f"{name:10s} {m['tokens_per_s_median']:>16,.0f} {m['tokens_per_cpu_s_median']:>20,.0f} "
            f"{m['peak_mem_bytes_median'] / 2**20:>22.1f}"
        )
    for label, r_all, r_rounds in (
        ("wall clock", wall_ratio, wall_rounds),
        ("thread CPU", cpu_ratio, cpu_rounds),
    ):
        per = ", ".join(f"{x:.3f}" for x in r_rounds)
        print(f"trainer / minimal, {label}: {r_all:.3f}  (rounds: {per})")
    print(f"load average over the last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    out = Path(args.out) if args.out else RESULTS / f"local_loop_{device.type}.json"
    record = {
        "benchmark": "local_loop",
        "swarmtrain": __version__,
        "torch": torch.__version__,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": os.getloadavg()[0],
        "args": vars(args),
        "tokens_per_step": args.batch_size * resolve_spec(cfg.model).block_size,
        "memory_metric": mem_label,
        "rounds": rows,
        "summary": summary,
        "ratio_trainer_over_minimal": wall_ratio,
        "ratio_per_round": wall_rounds,
        "cpu_time_ratio_trainer_over_minimal": cpu_ratio,
        "cpu_time_ratio_per_round": cpu_rounds,
        "note": "tok/cpu-s uses the main thread's CPU time (time.thread_time): with --threads 1 on CPU it "
        "is the loop's own compute, insensitive to other processes sharing the cores",
    }
    from runlog import write_report  # type: ignore[import-not-found]  # benchmarks/ is sys.path[0]

    write_report(out, record, indent=1)


if __name__ == "__main__":
    main()
