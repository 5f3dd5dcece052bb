"""Codecs on real pseudo-gradients: capture a DiLoCo run's outer deltas, then measure every codec's
error and bits per element on them, with and without error feedback over consecutive rounds.

``capture`` trains a DiLoCo run with the in-process harness (the same ``Trainer``, strategy and data
as a peer) through a collective that records what worker 0 hands to each ``all_reduce``: its
pseudo-gradient of that round, before any codec. Each round is saved as
``round-NNNN.safetensors`` (no pickle) with ``run.json`` saying which run it was.

``measure`` replays the rounds through one codec: per round the relative L2 error of what a peer
would send (``|x - decode(compress(x))| / |x|`` over all tensors), and over the rounds the error of
the sum of what was sent against the sum of the pseudo-gradients (what the outer step integrates).
With error feedback (``compression.ErrorFeedback``) the per-round error is larger or equal, but what
a round drops is sent later, so the error of the sum stays bounded instead of growing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError

__all__ = ["capture", "load_rounds", "measure", "measure_all", "table_lines", "ROUND_GLOB"]

ROUND_GLOB = "round-*.safetensors"


class _Recorder:
    """A ``Collective`` that records (a copy of) every tensor set it is asked to reduce, then reduces."""

    def __init__(self, inner: Any, rounds: list[dict[str, torch.Tensor]]) -> None:
        self.inner = inner
        self.rounds = rounds

    @property
    def peer_id(self) -> str:
        return str(self.inner.peer_id)

    def all_reduce(self, tensors: Mapping[str, torch.Tensor], **kw: Any) -> Any:
        self.rounds.append({k: v.detach().float().clone().contiguous() for k, v in tensors.items()})
        return self.inner.all_reduce(tensors, **kw)

    def all_gather(self, payload: bytes, **kw: Any) -> Any:
        return self.inner.all_gather(payload, **kw)


def capture(cfg: Config, workers: int, out_dir: Path) -> list[Path]:
    """Train ``cfg`` (a DiLoCo run) with ``workers`` in-process workers and save worker 0's
    pseudo-gradient of every sync into ``out_dir``. Returns the files written."""
    from safetensors.torch import save_file

    from swarmtrain.app.bench.harness import run_in_process

    if cfg.strategy.name != "diloco":
        raise ConfigError(f"capturing pseudo-gradients needs strategy diloco, got {cfg.strategy.name!r}")
    rounds: list[dict[str, torch.Tensor]] = []

    def wrap(index: int, member: Any) -> Any:
        return _Recorder(member, rounds) if index == 0 else member

    res = run_in_process(cfg, workers, wrap=wrap)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, tensors in enumerate(rounds):
        paths.append(out_dir / f"round-{i:04d}.safetensors")
        save_file(tensors, str(paths[-1]))
    meta = {
        "strategy": cfg.strategy.model_dump(),
        "codec": cfg.compression.codec,
        "preset": cfg.model.preset,
        "workers": workers,
        "steps": cfg.train.steps,
        "rounds": len(rounds),
        "final_val_loss": res.final_val_loss,
    }
    (out_dir / "run.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return paths


def load_rounds(run_dir: Path) -> list[dict[str, torch.Tensor]]:
    """The captured rounds of ``run_dir``, in order; every round must hold the same float tensors.

    Raises:
        ConfigError: no rounds there, an unreadable file, or rounds that disagree.
    """
    from safetensors.torch import load_file

    files = sorted(run_dir.glob(ROUND_GLOB))
    if not files:
        raise ConfigError(f"--from-run {run_dir}: no {ROUND_GLOB} files there (capture a run with --capture)")
    rounds = []
    for f in files:
        try:
            rounds.append(load_file(str(f)))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
            raise ConfigError(f"--from-run: {f.name} is not a safetensors file ({e})") from None
    shapes = {k: tuple(v.shape) for k, v in rounds[0].items()}
    for f, r in zip(files, rounds, strict=True):
        if {k: tuple(v.shape) for k, v in r.items()} != shapes:
            raise ConfigError(f"--from-run: {f.name} holds other tensors than {files[0].name}")
        if not all(v.is_floating_point() for v in r.values()):
            raise ConfigError(f"--from-run: {f.name} holds a non-float tensor")
    return rounds


def measure(
    rounds: Sequence[Mapping[str, torch.Tensor]], codec: str, error_feedback: bool
) -> dict[str, float]:
    """One codec over the rounds: bits per element, the mean per-round relative L2 error, and the
    relative L2 error of the sum over rounds (the outer step's view)."""
    from compression import ErrorFeedback, make_codec

    c = make_codec(codec)
    if error_feedback:
        c = ErrorFeedback(c)
    bits = numel = 0
    errors: list[float] = []
    true_sum: dict[str, torch.Tensor] = {}
    sent_sum: dict[str, torch.Tensor] = {}
    for r in rounds:
        num = den = 0.0
        for key, t in r.items():
            t = t.float()
            p = c.compress(t, key=key)
            d = c.decompress(p).reshape(t.shape).to(torch.float64)
            bits += 8 * p.payload_nbytes
            numel += t.numel()
            num += float((t.double() - d).pow(2).sum())
            den += float(t.double().pow(2).sum())
            true_sum[key] = true_sum.get(key, 0) + t.double()
            sent_sum[key] = sent_sum.get(key, 0) + d
        errors.append(math.sqrt(num / den) if den else 0.0)
    diff = sum(float((true_sum[k] - sent_sum[k]).pow(2).sum()) for k in true_sum)
    norm = sum(float(v.pow(2).sum()) for v in true_sum.values())
    return {
        "bits_per_element": bits / max(numel, 1),
        "round_error": sum(errors) / max(len(errors), 1),
        "sum_error": math.sqrt(diff / norm) if norm else 0.0,
    }


def measure_all(rounds: Sequence[Mapping[str, torch.Tensor]], codecs: Sequence[str]) -> list[dict[str, Any]]:
    """Every codec without and with error feedback, one row each."""
    rows = []
    for codec in codecs:
        plain, ef = measure(rounds, codec, False), measure(rounds, codec, True)
        rows.append(
            {
                "codec": codec,
                "bits_per_element": plain["bits_per_element"],
                "round_error": plain["round_error"],
                "sum_error": plain["sum_error"],
                "round_error_ef": ef["round_error"],
                "sum_error_ef": ef["sum_error"],
            }
        )
    return rows


def table_lines(rows: Sequence[Mapping[str, Any]], rounds: int, numel: int) -> list[str]:
    """The rows as plain text that fits 80 columns."""
    head = f"{'':<14}{'bits /':>8}{'per round':>12}{'sum of':>12}{'per round':>12}{'sum of':>12}"
    sub = (
        f"{'codec':<14}{'element':>8}{'error':>12}{f'{rounds} rounds':>12}{'error, EF':>12}{'rounds, EF':>12}"
    )
    lines = [head, sub]
    for r in rows:
        lines.append(
            f"{r['codec']:<14.14}{r['bits_per_element']:>8.3f}{r['round_error']:>12.2e}{r['sum_error']:>12.2e}"
            f"{r['round_error_ef']:>12.2e}{r['sum_error_ef']:>12.2e}"
        )
    lines.append(f"relative L2 errors on {rounds} DiLoCo pseudo-gradients of {numel:,} elements each")
    return lines
