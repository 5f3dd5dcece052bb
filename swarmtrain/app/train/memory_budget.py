"""Memory budget of one peer: bytes per parameter by component, where they live, and what fits.

Pure arithmetic on the run config (no tensors are allocated), so ``train``, ``join`` and the memory
benchmark can print it before anything is built. The rules, per trainable parameter (``N`` of them):

* **weights**: fp32, 4 B on the device (the trainer keeps fp32 masters; bf16 is autocast only).
* **grads**: fp32, 4 B on the device; alive from backward until after ``strategy.step``.
* **inner states**: ``adamw`` two fp32 moments (8 B); ``adamw8bit`` (bitsandbytes ``AdamW8bit``) two
  uint8 moments plus one fp32 absmax per 256-element block and state (2 + 8/256 B), but 8 B for
  tensors under 4096 elements (bitsandbytes' ``min_8bit_size``), so it is computed per tensor;
  ``sgd`` one fp32 momentum buffer (4 B, none when ``beta1 == 0``). DeMo never steps the inner
  optimizer, so it has none.
* **outer state** (DiLoCo, Streaming DiLoCo; Douillard et al. 2023): the fp32 anchor (4 B) and the
  outer Nesterov momentum (4 B; 0 when ``outer_momentum == 0``). ``strategy.outer_state``:
  ``device`` keeps both on the device, ``cpu`` on the host, ``cpu8`` on the host with the momentum
  in blockwise int8 (1 + 4/256 B; the anchor stays fp32, since outer updates must not be rounded).
* **residuals**: error feedback (``compression.error_feedback``) keeps one float64 residual per sent
  element (8 B; ``ef21`` a float32 estimate, 4 B) plus, as a partition owner, one per element of its
  partition for the aggregate it sends back (at most half of them, with 2 peers: 12 B and 6 B in all)
  on the device, where what is sent is built; DeMo keeps its
  fp32 local momentum (4 B), the part of the update not yet sent.
* **buffers** (during a sync): DataParallel and DiLoCo build a flat fp32 copy of what they send
  (4 B, plus the fp32 pseudo-gradient for DiLoCo, 4 B) on the device, whatever ``outer_state``
  says (``optimizers.outer_store`` brings the anchor over one tensor at a time), and the
  collective decodes into one fp32 result on the host (4 B) plus the encoded packets (the codec's
  bits / 8). Streaming DiLoCo needs one fragment's worth (1/F). DeMo transforms one tensor at a
  time: twice its largest tensor in fp32.
* **activations** (estimated, not measured): per micro-batch of ``B`` sequences of ``T`` tokens,
  eager mode, fused attention (no T x T scores kept), per token and layer ``2 d`` fp32 residual
  stream elements plus ``14 d`` elements at the compute width ``s`` (2 B under bf16 autocast, else
  4 B); the head keeps ``4 d + s d + V (s + 8)`` bytes per token (logits, fp32 log-softmax and its
  gradient); under bf16 autocast the cached bf16 weight copies add 2 B per parameter.

Peak on the device (and, separately, on the host) = weights + inner states + outer state +
residuals + grads + max(activations, sync buffers): gradients are alive in both phases, activations
are freed by backward before ``strategy.step`` syncs. On a CPU device both sides are the same RAM.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from swarmtrain.app.models.presets import PRESETS, GPTSpec, resolve_spec
from swarmtrain.core.config import Config

__all__ = [
    "Component",
    "MemoryBudget",
    "param_shapes",
    "activation_bytes",
    "memory_budget",
    "largest_fitting_preset",
    "free_memory",
    "format_budget",
    "budget_report",
    "check_fits",
    "BNB_MIN_8BIT_SIZE",
    "BLOCK",
]

Where = Literal["device", "host"]
Phase = Literal["persistent", "step", "sync"]

BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes keeps 32-bit states for smaller tensors
BLOCK = 256  # elements per absmax of the blockwise 8-bit states (ours and bitsandbytes')
MiB = 1 << 20

# payload bits per element of each codec (blockwise ones: one fp32 absmax per block of 256)
_CODEC_BITS: dict[str, float] = {
    "none": 32.0,
    "fp32": 32.0,
    "fp16": 16.0,
    "bf16": 16.0,
    "int8": 8.0 + 32.0 / BLOCK,
    "int4": 4.0 + 32.0 / BLOCK,
    "ternary": 2.0 + 32.0 / BLOCK,
}


@dataclass(frozen=True)
class Component:
    """One line of the budget.

    Attributes:
        name: weights, grads, inner states, outer state, residuals, buffers or activations.
        total_bytes: bytes for the whole model.
        where: ``device`` (the training device) or ``host`` (CPU RAM).
        phase: ``persistent``, ``step`` (forward/backward only) or ``sync`` (during a sync only).
        note: what is counted, in a few words.
        estimated: the figure is a rule of thumb (activations), not exact arithmetic.
    """

    name: str
    total_bytes: int
    where: Where
    phase: Phase
    note: str = ""
    estimated: bool = False


@dataclass(frozen=True)
class MemoryBudget:
    """The budget of one configuration.

    Attributes:
        num_params: trainable parameters ``N`` (tied embedding counted once).
        device_type: ``cuda`` or ``cpu``.
        preset: the model preset named in the config.
        components: the lines (zero-byte ones left out).
    """

    num_params: int
    device_type: str
    preset: str
    components: tuple[Component, ...] = field(default_factory=tuple)

    def peak_bytes(self, where: Where) -> int:
        """Persistent + grads + max(activations, sync buffers) on one side."""
        mine = [c for c in self.components if c.where == where]
        persistent = sum(c.total_bytes for c in mine if c.phase == "persistent")
        step = sum(c.total_bytes for c in mine if c.phase == "step")
        sync = sum(c.total_bytes for c in mine if c.phase == "sync")
        grads = sum(c.total_bytes for c in mine if c.name == "grads")
        return persistent + grads + max(step - grads, sync)

    def total_peak_bytes(self) -> int:
        """Peak over both sides: what a CPU device, where both are one RAM, needs."""
        if self.device_type == "cpu":
            merged = MemoryBudget(
                self.num_params,
                self.device_type,
                self.preset,
                tuple(Component(c.name, c.total_bytes, "device", c.phase) for c in self.components),
            )
            return merged.peak_bytes("device")
        return self.peak_bytes("device") + self.peak_bytes("host")

    def bytes_per_param(self, where: Where | None = None) -> float:
        """Peak bytes per parameter on ``where`` (both sides when ``None``)."""
        total = self.total_peak_bytes() if where is None else self.peak_bytes(where)
        return total / max(self.num_params, 1)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (benchmarks write it)."""
        return {
            "num_params": self.num_params,
            "device_type": self.device_type,
            "preset": self.preset,
            "peak_device_bytes": self.peak_bytes("device"),
            "peak_host_bytes": self.peak_bytes("host"),
            "total_peak_bytes": self.total_peak_bytes(),
            "components": [
                {
                    "name": c.name,
                    "bytes_per_param": c.total_bytes / max(self.num_params, 1),
                    "total_bytes": c.total_bytes,
                    "where": c.where,
                    "phase": c.phase,
                    "note": c.note,
                    "estimated": c.estimated,
                }
                for c in self.components
            ],
        }


def param_shapes(spec: GPTSpec) -> list[tuple[int, ...]]:
    """Shapes of the GPT's trainable tensors (``swarmtrain.app.models.gpt``; lm_head tied to wte)."""
    d, v, t = spec.n_embd, spec.vocab_size, spec.block_size
    shapes: list[tuple[int, ...]] = [(v, d), (t, d)]
    for _ in range(spec.n_layer):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,)]  # ln_1, attention
        shapes += [(d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]  # ln_2, MLP
    shapes += [(d,), (d,)]  # ln_f
    return shapes


def _numel(shape: Iterable[int]) -> int:
    return math.prod(shape)


def activation_bytes(spec: GPTSpec, batch_size: int, bf16: bool) -> int:
    """Estimated bytes kept for backward by one micro-batch (rule in the module docstring)."""
    d, v, s = spec.n_embd, spec.vocab_size, 2 if bf16 else 4
    per_token = spec.n_layer * (2 * d * 4 + 14 * d * s) + 4 * d + s * d + v * (s + 8) + 4 * d
    return batch_size * spec.block_size * per_token


def _inner_state_bytes(optimizer: str, shapes: list[tuple[int, ...]], beta1: float) -> tuple[int, str]:
    if optimizer == "adamw8bit":
        total = 0.0
        for sh in shapes:
            n = _numel(sh)
            total += 8 * n if n < BNB_MIN_8BIT_SIZE else 2 * n + 2 * 4 * math.ceil(n / BLOCK)
        return int(total), "2 x uint8 + absmax"
    n = sum(_numel(sh) for sh in shapes)
    if optimizer == "sgd":
        return (4 * n if beta1 > 0 else 0), "fp32 momentum"
    return 8 * n, "2 x fp32 moments"


def _codec_bytes(cfg: Config, numel: int) -> int:
    codec = cfg.compression.codec
    if codec.startswith("topk"):
        value_bits = _CODEC_BITS.get(codec.partition("+")[2] or "none", 32.0)
        return int(numel * cfg.compression.topk_fraction * (32 + value_bits) / 8)
    return int(numel * _CODEC_BITS.get(codec, 32.0) / 8)


def _state_components(cfg: Config, shapes: list[tuple[int, ...]], n: int) -> list[Component]:
    """What a peer keeps between steps beyond its weights: inner optimizer states, the outer loop's
    anchor and momentum, error-feedback residuals (DeMo: its local momentum)."""
    tc, st = cfg.train, cfg.strategy
    name = st.name
    comps: list[Component] = []
    if name != "demo":
        optimizer = str(getattr(tc, "optimizer", "adamw"))
        inner, note = _inner_state_bytes(optimizer, shapes, tc.beta1)
        comps.append(Component("inner states", inner, "device", "persistent", f"{optimizer} {note}"))
    if name in ("diloco", "streaming_diloco"):
        placement = str(getattr(st, "outer_state", "device"))
        outer_where: Where = "device" if placement == "device" else "host"
        momentum = getattr(st, "outer_momentum", 0.9) > 0
        mom_bytes = (n + 4 * math.ceil(n / BLOCK)) if placement == "cpu8" else 4 * n
        comps.append(
            Component(
                "outer state",
                4 * n + (mom_bytes if momentum else 0),
                outer_where,
                "persistent",
                f"{placement}: anchor+" + ("int8 mom." if placement == "cpu8" else "mom."),
            )
        )
    ef = cfg.compression.error_feedback
    if name == "demo":
        comps.append(Component("residuals", 4 * n, "device", "persistent", "DeMo fp32 momentum"))
    elif name != "local" and ef != "none":
        comps.append(
            # a residual per element sent, plus the owner's aggregate memory for its partition (1/n of
            # the elements; at most half of them, with 2 peers)
            Component("residuals", (12 if ef == "ef" else 6) * n, "device", "persistent", f"{ef} residual")
        )
    return comps


def _sync_buffers(cfg: Config, shapes: list[tuple[int, ...]], n: int) -> list[Component]:
    """The buffers a sync builds: what is sent (device) and what is received and decoded (host)."""
    st = cfg.strategy
    name = st.name
    if name in ("data_parallel", "diloco", "streaming_diloco"):
        share = 1.0 / getattr(st, "fragments", 1) if name == "streaming_diloco" else 1.0
        sent = int(n * share)
        copies = 2 if name in ("diloco", "streaming_diloco") else 1
        return [
            Component(
                "buffers", 4 * copies * sent, "device", "sync", "flat" + ("+pseudo-grad" * (copies - 1))
            ),
            Component("buffers", 4 * sent + _codec_bytes(cfg, sent), "host", "sync", "result+packets"),
        ]
    if name == "demo":
        largest = max(_numel(sh) for sh in shapes)
        return [Component("buffers", 2 * 4 * largest, "device", "sync", "DCT of one tensor")]
    return []


def memory_budget(cfg: Config, device_type: str = "cpu", spec: GPTSpec | None = None) -> MemoryBudget:
    """Bytes per component for ``cfg`` on a ``device_type`` (``cuda`` or ``cpu``) device.

    Args:
        cfg: the run config (model, train.optimizer, strategy, compression).
        device_type: where training runs; ``cuda`` turns on bf16 autocast unless ``train.bf16 = off``.
        spec: the model's exact shape (default: resolved from ``cfg.model``).
    """
    spec = spec or resolve_spec(cfg.model)
    shapes = param_shapes(spec)
    n = sum(_numel(sh) for sh in shapes)
    tc = cfg.train
    bf16 = (device_type == "cuda" and tc.bf16 != "off") or tc.bf16 == "on"
    acts = activation_bytes(spec, tc.batch_size, bf16) + (2 * n if bf16 else 0)
    comps = [
        Component("weights", 4 * n, "device", "persistent", "fp32 masters"),
        Component("grads", 4 * n, "device", "step", "fp32"),
        *_state_components(cfg, shapes, n),
        *_sync_buffers(cfg, shapes, n),
        Component(
            "activations", acts, "device", "step", f"B={tc.batch_size} T={spec.block_size}", estimated=True
        ),
    ]
    if device_type == "cpu":  # one RAM: label every line as host
        comps = [Component(c.name, c.total_bytes, "host", c.phase, c.note, c.estimated) for c in comps]
    comps = [c for c in comps if c.total_bytes > 0]
    return MemoryBudget(n, device_type, cfg.model.preset, tuple(comps))


def _with_preset(cfg: Config, preset: str) -> Config:
    model = cfg.model.model_copy(
        update={"preset": preset, "n_layer": None, "n_head": None, "n_embd": None, "block_size": None}
    )
    return cfg.model_copy(update={"model": model})


def largest_fitting_preset(
    cfg: Config, device_type: str, free_device: int, free_host: int | None = None
) -> str | None:
    """The largest preset (by parameters) whose budget fits, with ``cfg``'s other settings.

    Args:
        cfg: the run config; its model section is replaced by each preset's own shape.
        device_type: ``cuda`` or ``cpu``.
        free_device: free bytes on the device (on CPU: available RAM).
        free_host: available host RAM for a CUDA device (``None``: not checked).
    """
    best: tuple[int, str] | None = None
    for preset in PRESETS:
        b = memory_budget(_with_preset(cfg, preset), device_type)
        if device_type == "cpu":
            fits = b.total_peak_bytes() <= free_device
        else:
            fits = b.peak_bytes("device") <= free_device and (
                free_host is None or b.peak_bytes("host") <= free_host
            )
        if fits and (best is None or b.num_params > best[0]):
            best = (b.num_params, preset)
    return None if best is None else best[1]


def free_memory(device: Any) -> tuple[int, int]:
    """``(free bytes on the device, available host RAM)``; on CPU both are the available RAM."""
    import psutil
    import torch

    dev = torch.device(device)
    host = int(psutil.virtual_memory().available)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free), host
    return host, host


def format_budget(budget: MemoryBudget, largest: str | None = None, free: int | None = None) -> str:
    """A plain-text table under 80 columns: component, bytes/param, total MiB, where."""
    rows = [("component", "B/param", "MiB", "where", "note")]
    for c in budget.components:
        mark = "~" if c.estimated else ""
        phase = "" if c.phase == "persistent" else f" ({c.phase})"
        rows.append(
            (
                c.name,
                f"{mark}{c.total_bytes / max(budget.num_params, 1):.2f}",
                f"{mark}{c.total_bytes / MiB:,.1f}",
                c.where,
                (c.note + phase)[:32],
            )
        )
    if budget.device_type == "cpu":
        rows.append(
            ("peak", f"{budget.bytes_per_param():.2f}", f"{budget.total_peak_bytes() / MiB:,.1f}", "host", "")
        )
    else:
        for side in ("device", "host"):
            peak = budget.peak_bytes(side)  # type: ignore[arg-type]
            rows.append(("peak", f"{peak / max(budget.num_params, 1):.2f}", f"{peak / MiB:,.1f}", side, ""))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:<{widths[3]}}  {r[4]}".rstrip()
        for r in rows
    ]
    lines.insert(1, "-" * min(79, max(len(x) for x in lines)))
    head = f"memory budget: {budget.preset}, {budget.num_params / 1e6:.2f}M params ({budget.device_type})"
    tail = []
    if free is not None:
        tail.append(f"free: {free / MiB:,.0f} MiB; largest preset that fits: {largest or 'none'}")
    return "\n".join([head, *lines, *tail])


def budget_report(cfg: Config, device: Any) -> str:
    """The budget table of ``cfg`` on ``device`` with its free memory and largest fitting preset."""
    import torch

    dev = torch.device(device)
    free_dev, free_host = free_memory(dev)
    budget = memory_budget(cfg, dev.type)
    largest = largest_fitting_preset(cfg, dev.type, free_dev, None if dev.type == "cpu" else free_host)
    return format_budget(budget, largest, free_dev)


def check_fits(cfg: Config, device: Any, run_id: str) -> None:
    """Refuse a run whose model does not fit this machine, before anything is allocated: its budget
    (``memory_budget``, pure arithmetic) against the free memory of ``device`` (and, for a GPU, the
    host RAM its host side needs).

    Raises:
        ConfigError: one line: the model, what it needs and what is free.
    """
    import torch

    from swarmtrain.core.errors import ConfigError

    dev = torch.device(device)
    free_dev, free_host = free_memory(dev)
    b = memory_budget(cfg, dev.type)
    if dev.type == "cpu":
        sides = [("RAM", b.total_peak_bytes(), free_dev)]
    else:
        sides = [
            (f"{dev.type} memory", b.peak_bytes("device"), free_dev),
            ("RAM", b.peak_bytes("host"), free_host),
        ]
    for where, need, free in sides:
        if need > free:
            spec = resolve_spec(cfg.model)
            gib = float(1 << 30)
            raise ConfigError(
                f"run {run_id!r} trains a model of {b.num_params / 1e9:.2f}G parameters "
                f"({spec.n_layer} layers x {spec.n_embd} wide) that needs {need / gib:,.1f} GiB of {where}; "
                f"this machine has {free / gib:,.1f} GiB free: it cannot take part in this run"
            )
