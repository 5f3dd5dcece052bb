"""``docs/benchmarks.md``'s GPU table (``benchmarks/docs_tables.py``'s ``gpu``), from
``gpu_cuda.json`` and ``gpu_cuda_local_loop.json`` that ``benchmarks/gpu.py`` wrote on a lent GPU."""

from __future__ import annotations

from typing import Any

from docs_md import MiB, _md, _range, load  # type: ignore[import-not-found]

__all__ = ["gpu_table"]


def _met(goals: dict[str, Any]) -> str:
    return "met" if all(g["met"] for g in goals.values()) else "not met"


def _gpu_strategy_rows(sec: dict[str, Any]) -> list[list[str]]:
    rows = []
    for i, (name, r) in enumerate(sec["runs"].items()):
        what = name
        if i == 0:
            what += f", 2 peers on {sec['device']}, {sec['preset']} preset"
            what += f", {sec['steps']} steps of {sec['batch']}, {r['compressor']}"
        elif name == "diloco":
            what += f" H={sec['inner_steps']}"
        same = "identical" if r["params_identical"] else "NOT identical"
        fig = (
            f"val loss {r['final_val_loss']:.3f}, {same}, {r['bytes_sent_per_peer'] / MiB:.3g} MiB/peer, "
            f"{r['run_wall_s']:.0f} s"
        )
        goal = sec["goals"][f"{name}_identical"]
        rows.append([what, fig, "identical: " + ("met" if goal["met"] else "not met")])
    return rows


def _gpu_codec_cell(c: dict[str, Any]) -> str:
    comp, dec = c["compress"], c["decompress"]
    return (
        f"{comp['gbps']:.1f} ({comp['old_gbps']:.1f}) / {dec['gbps']:.1f} ({dec['old_gbps']:.1f}); "
        f"{comp['fraction']:.2f} / {dec['fraction']:.2f} of the pinned bound"
    )


def gpu_table() -> str:
    """``gpu_cuda.json`` (every section but the local loop) and ``gpu_cuda_local_loop.json``."""
    rec = load("gpu_cuda.json")
    secs = rec["sections"]
    rows = _gpu_strategy_rows(secs["strategies"])
    sw = secs["swarm"]
    devs = "/".join(sorted({f"`{d}`" for d in sw["server_devices"].values()}))
    same = "replicas identical" if sw["params_identical"] else "replicas NOT identical"
    rows.append(
        [
            f"SWARM, 2 stages, servers on {devs}",
            f"val loss {sw['final_val_loss']:.3f}, {same}, {sw['lost_microbatches']} lost",
            _met(sw["goals"]),
        ]
    )
    cod = secs["codecs"]
    goal = f">= {cod['goal_gbps']:.0f} GB/s, >= {cod['goal_fraction']}"
    for name, c in cod["codecs"].items():
        goals = {k: v for k, v in cod["goals"].items() if k.startswith(name + "_")}
        what = f"{name} compress / decompress, GB/s of fp32 input (old path)"
        rows.append([what, _gpu_codec_cell(c), f"{goal}: {_met(goals)}"])
    loop = load("gpu_cuda_local_loop.json")["sections"]["local_loop"]
    run = loop["runs"]["compile"]
    mfu = loop["goals"]["mfu_compiled_bf16"]
    rows.append(
        [
            f"local loop, {loop['preset']} compiled bf16, batch {run['batch']} (fits 24 GB)",
            f"MFU {run['mfu']:.1%}, Trainer {run['ratio_trainer_over_minimal']:.2f}x a minimal loop",
            f"MFU >= {mfu['target']:.0%}: {'met' if mfu['met'] else 'not met'}",
        ]
    )
    mem = secs["memory"]
    ratios = [r["measured_over_predicted"] for r in mem["rows"] if "measured_bytes" in r]
    batch = mem["rows"][0]["batch"]
    rows.append(
        [
            f"memory table, {mem['preset']} batch {batch}",
            f"CUDA peak / budget {_range([min(ratios), max(ratios)], '.2f')} in all {len(ratios)} rows",
            f"peak <= budget: {_met(mem['goals'])}",
        ]
    )
    dct = secs.get("dct", {})
    if dct.get("status") != "measured":
        rows.append(["DeMo's DCT extraction", str(dct.get("status", "not run")), "-"])
    head = f"On one {rec['device_name']} (torch {rec['torch']})"
    return head + ":\n\n" + _md(["section", "figure", "goal"], rows)
