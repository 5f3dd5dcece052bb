"""8-bit inner optimizer states vs fp32 AdamW: loss at equal steps and data, state size, speed.

Both runs train the same preset on the same batches from the same initialisation (one seed), one
after the other in this process, with ``train.optimizer`` the only difference: ``adamw`` (torch) and
``adamw8bit`` (bitsandbytes ``AdamW8bit``: two moments as ``uint8`` codes with a float32 absmax per
256 elements). Prints a table and writes ``benchmarks/results/adamw8bit_<device>.json``.

    python benchmarks/adamw8bit.py --steps 200 --threads 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runlog import recorded, write_report  # noqa: E402

from swarmtrain.app.train.trainer import Trainer  # noqa: E402
from swarmtrain.core.config import load_config  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("adamw", "adamw8bit")


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in the optimizer's per-parameter state (nested bitsandbytes state too)."""
    total, stack = 0, [optimizer.state_dict()["state"]]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            stack.extend(cur.values())
        elif isinstance(cur, torch.Tensor):
            total += cur.numel() * cur.element_size()
    return total


def _run(kind: str, args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    cfg = load_config(
        None,
        {
            "model.preset": args.preset,
            "train.optimizer": kind,
            "train.steps": args.steps,
            "train.batch_size": args.batch_size,
            "train.threads": args.threads,
            "train.device": args.device,
            "train.eval_interval": 10_000,
            "train.log_interval": max(1, args.steps // 20),
            "train.out_dir": f"{out_dir}/{kind}",
            "train.seed": args.seed,
        },
        env={},
    )
    trainer = Trainer(cfg)
    try:
        res = trainer.fit()
        window = [r["loss"] for r in res.history if r.get("kind") == "train"][-5:]
        return {
            "optimizer": kind,
            "final_val_loss": res.final_val_loss,
            "final_train_loss": res.final_train_loss,
            "last_train_window_mean": sum(window) / len(window) if window else None,
            "tokens_per_s": res.tokens / res.train_s if res.train_s > 0 else None,
            "optimizer_state_bytes": _state_bytes(trainer.optimizer),
            "steps": res.steps,
        }
    finally:
        trainer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="output path (default results/adamw8bit_<device>.json)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="adamw8bit-") as tmp:
        rows = [_run(kind, args, tmp) for kind in KINDS]
    base, eight = rows
    rel = (eight["final_val_loss"] / base["final_val_loss"] - 1.0) * 100 if base["final_val_loss"] else None
    summary = {
        "val_loss_diff_percent": rel,
        "state_bytes_ratio": eight["optimizer_state_bytes"] / base["optimizer_state_bytes"],
        "tokens_per_s_ratio": (eight["tokens_per_s"] or 0) / (base["tokens_per_s"] or 1),
    }
    payload = {
        "benchmark": "adamw8bit",
        "recorded": recorded(argv if argv is not None else sys.argv),
        "settings": vars(args),
        "rows": rows,
        "summary": summary,
    }
    device = args.device.split(":")[0]
    out = Path(args.json) if args.json else RESULTS / f"adamw8bit_{device}.json"
    write_report(out, payload, _table(rows, summary), indent=1)
    return 0


def _table(rows: list[dict[str, Any]], summary: dict[str, Any]) -> list[str]:
    """One line per optimizer and the 8-bit one against the fp32 one."""
    lines = [f"{'optimizer':<10}{'val loss':>10}{'train (last 5)':>16}{'state MB':>10}{'tok/s':>9}"]
    for r in rows:
        lines.append(
            f"{r['optimizer']:<10}{r['final_val_loss']:>10.4f}{r['last_train_window_mean']:>16.4f}"
            f"{r['optimizer_state_bytes'] / 1e6:>10.2f}{r['tokens_per_s']:>9.0f}"
        )
    lines.append(
        f"adamw8bit vs adamw: val loss {summary['val_loss_diff_percent']:+.2f} %, "
        f"state x{summary['state_bytes_ratio']:.2f}, tokens/s x{summary['tokens_per_s_ratio']:.2f}"
    )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
