"""Where DiLoCo's outer state lives (the fp32 anchor and the outer momentum) and how it moves per sync.

DiLoCo (Douillard et al. 2023) and Streaming DiLoCo (Douillard et al. 2025) keep, beside the model,
an fp32 anchor (the last global parameters) and the outer Nesterov momentum: two fp32 copies of the
model that are touched only at a sync. ``strategy.outer_state`` says where they live:

- ``"device"`` (the default): beside the parameters (on the GPU when the model is there).
- ``"cpu"``: in CPU memory, pinned when the model is on CUDA. At a sync each tensor's anchor and
  momentum are copied to the parameters' device (non-blocking from pinned memory), stepped there by
  the same ``OuterSGD.update`` as in ``"device"``, and copied back, one tensor at a time: the
  extra device memory at a sync is one tensor's anchor and momentum, not the model's. The results
  are bit-identical to ``"device"`` (the copies are exact and the arithmetic runs on the same device),
  so peers may mix the two. On a machine without CUDA the memory is ordinary CPU memory, and the
  copy-out/step/copy-back path still runs, so CI covers it.
- ``"cpu8"``: ``"cpu"`` with the momentum stored 8-bit blockwise by the project's ``int8`` codec
  (``compression.blockwise.Int8Compressor``, blocks of ``MOMENTUM_BLOCK``), encoded on the CPU after
  every step. The anchor stays fp32: it is what every peer agrees on and trains from, and an 8-bit
  anchor would put an error of up to ``absmax / 254`` of a block on every parameter at every sync, as
  large as the outer updates themselves. Each stored momentum element is within ``absmax / 254`` of
  its fp32 value (``absmax`` of its block of the momentum, plus a few float32 ulp), so one outer step
  from the same anchor and averaged pseudo-gradient moves a parameter at most
  ``lr * mu**2 * absmax / 254`` (Nesterov) or ``lr * mu * absmax / 254`` (heavy ball) away from the
  step with the exact momentum (``momentum_step_bound``). Peers stay bit-identical with each other:
  they hold the same momentum and quantise it the same way (on the CPU, a deterministic codec), but
  not with ``"device"``/``"cpu"`` peers, so every peer of a run must choose ``"cpu8"`` alike.

``state_dict`` carries the momentum as it is stored (fp32 ``buffers``; in ``"cpu8"``, the int8 codes
and scales as ``buffers_int8``); ``load_state_dict`` takes either form in any mode, so a state saved
in one mode loads into another: exactly between ``"device"`` and ``"cpu"``, and exactly from
``"cpu8"`` into any mode (the decoded momentum is what ``"cpu8"`` steps with).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from compression.blockwise import Int8Compressor
from optimizers.outer import OuterSGD, saved_hyperparameters
from swarmtrain.core.config import BaseStrategyConfig, OuterLoopConfig
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.packet import Packet

__all__ = [
    "MOMENTUM_BLOCK",
    "OuterStateBytes",
    "OuterStore",
    "momentum_step_bound",
    "outer_state_bytes_per_param",
]

MOMENTUM_BLOCK = 256
"""Elements per block of the 8-bit momentum (``"cpu8"``): one float32 scale per 256 codes."""

Apply = Callable[[str, torch.Tensor], None]


@dataclass(frozen=True)
class OuterStateBytes:
    """Persistent bytes of the outer state per trainable parameter.

    Attributes:
        device: bytes on the parameters' device (the GPU when the model is on one).
        host: bytes in CPU memory (pinned when the model is on CUDA).
    """

    device: float
    host: float


def outer_state_bytes_per_param(cfg: BaseStrategyConfig) -> OuterStateBytes:
    """Bytes per trainable parameter that the anchor and outer momentum of ``cfg``'s strategy keep.

    ``"device"``: 4 (anchor) + 4 (momentum) on the device; ``"cpu"``: the same 8 in host memory;
    ``"cpu8"``: 4 + ``1 + 4 / MOMENTUM_BLOCK`` in host memory. No momentum when ``outer_momentum``
    is 0. Strategies without an outer loop keep none. Not counted: the transient fp32
    pseudo-gradient of a sync (4 bytes per synced parameter, on the device in every mode) and, in the
    CPU modes, one tensor's anchor and momentum on the device while it is stepped.
    """
    if not isinstance(cfg, OuterLoopConfig):
        return OuterStateBytes(0.0, 0.0)
    momentum = 0.0
    if cfg.outer_momentum > 0:
        momentum = 1.0 + 4.0 / MOMENTUM_BLOCK if cfg.outer_state == "cpu8" else 4.0
    total = 4.0 + momentum
    if cfg.outer_state == "device":
        return OuterStateBytes(device=total, host=0.0)
    return OuterStateBytes(device=0.0, host=total)


def momentum_step_bound(buf: torch.Tensor, lr: float, momentum: float, nesterov: bool) -> torch.Tensor:
    """Per-element bound on how far one ``"cpu8"`` outer step moves a parameter from the exact step.

    ``buf`` is the fp32 momentum before the step (flat order of the tensor, blocks of
    ``MOMENTUM_BLOCK``); its stored 8-bit copy is within ``absmax / 254`` per element (the ``int8``
    codec's bound), which the step scales by ``lr * mu**2`` (Nesterov: ``d = g + mu * (mu * buf +
    g)``) or ``lr * mu`` (heavy ball). The float32 rounding of the codec (a few ulp of ``absmax``)
    is covered by a margin of ``1e-5`` relative.
    """
    flat = buf.detach().float().reshape(-1)
    n = flat.numel()
    pad = (-n) % MOMENTUM_BLOCK
    blocks = torch.cat([flat.abs(), flat.new_zeros(pad)]).reshape(-1, MOMENTUM_BLOCK)
    absmax = blocks.amax(1, keepdim=True).expand(-1, MOMENTUM_BLOCK).reshape(-1)[:n]
    scale = lr * (momentum**2 if nesterov else momentum)
    return (absmax / 254.0 * (1.0 + 1e-5) * scale).reshape(buf.shape)


class OuterStore:
    """The anchor and outer momentum of an outer-loop strategy, kept where ``outer_state`` says.

    Args:
        params: the trainable parameters (name -> tensor); the anchor starts as their fp32 copy.
        cfg: the strategy's options (``outer_lr``, ``outer_momentum``, ``nesterov``, ``outer_state``).

    Attributes:
        anchor: name -> fp32 anchor, on its home (the parameters' device, or CPU memory). The dict
            object stays the same for the store's life (loads replace its entries), so a strategy may
            keep a reference to it.
        outer: the ``OuterSGD`` holding the hyper-parameters and the per-tensor arithmetic.
    """

    def __init__(self, params: Mapping[str, torch.Tensor], cfg: OuterLoopConfig) -> None:
        self.mode = cfg.outer_state
        self.outer = OuterSGD(cfg.outer_lr, cfg.outer_momentum, cfg.nesterov)
        self.devices = {n: p.device for n, p in params.items()}
        self.shapes = {n: tuple(p.shape) for n, p in params.items()}
        self._cuda = sorted({d for d in self.devices.values() if d.type == "cuda"}, key=str)
        # pinned only where it pays: CUDA present and the model on it
        self.pinned = self.mode != "device" and torch.cuda.is_available() and bool(self._cuda)
        self.codec = Int8Compressor(block=MOMENTUM_BLOCK)
        self.anchor: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            self.anchor.update({n: self._home(n, p.detach()) for n, p in params.items()})
        self.momentum: dict[str, torch.Tensor] = {}  # fp32 at home ("device", "cpu")
        self.momentum_q: dict[str, Packet] = {}  # int8 packets in CPU memory ("cpu8")

    # ------------------------------------------------------------------ where tensors live
    def _home(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A fresh fp32 copy of ``t`` where this mode keeps state for ``name``."""
        if self.mode == "device":
            return t.to(device=self.devices[name], dtype=torch.float32, copy=True)
        out = torch.empty(self.shapes[name], dtype=torch.float32, pin_memory=self.pinned)
        out.copy_(t)
        return out

    def _to_device(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A device copy of home tensor ``t`` (always a copy: on a CPU-only machine too)."""
        return t.to(self.devices[name], non_blocking=self.pinned, copy=True)

    def _sync(self) -> None:
        """Wait for non-blocking copies into or out of pinned memory before the host touches it."""
        if self.pinned:
            for d in self._cuda:
                torch.cuda.synchronize(d)

    def anchor_on_device(self, name: str) -> torch.Tensor:
        """The anchor of ``name`` on its parameter's device; read it, never write it."""
        a = self.anchor[name]
        return a if self.mode == "device" else self._to_device(name, a)

    # ------------------------------------------------------------------ the outer step
    def _fetch_momentum(self, name: str) -> torch.Tensor | None:
        if self.mode == "cpu8":
            pkt = self.momentum_q.get(name)
            return None if pkt is None else self.codec.decompress(pkt).to(self.devices[name])
        buf = self.momentum.get(name)
        if buf is None or self.mode == "device":
            return buf
        return self._to_device(name, buf)

    def _put_momentum(self, name: str, buf: torch.Tensor) -> None:
        if self.mode == "cpu8":  # encoded on the CPU: the same bytes on every peer, whatever its device
            self.momentum_q[name] = self.codec.compress(buf.to("cpu"))
        elif self.mode == "device":
            self.momentum[name] = buf
        else:
            home = self.momentum.get(name)
            if home is None:
                home = self.momentum[name] = torch.empty(
                    self.shapes[name], dtype=torch.float32, pin_memory=self.pinned
                )
            home.copy_(buf, non_blocking=self.pinned)

    @torch.no_grad()
    def step(self, grads: Mapping[str, torch.Tensor], apply: Apply) -> None:
        """Outer step of the anchor for every name in ``grads``, one tensor at a time.

        ``apply(name, anchor)`` is called with the new anchor on the parameter's device (to copy or
        mix it into the model) before it goes back home; it must not modify it.
        """
        for name, g in grads.items():
            dev = self.devices[name]
            a = self.anchor_on_device(name)
            buf = self.outer.update(a, self._fetch_momentum(name), g.to(dev))
            apply(name, a)
            if self.mode != "device":
                self.anchor[name].copy_(a, non_blocking=self.pinned)
            if buf is not None:
                self._put_momentum(name, buf)
        self._sync()

    # ------------------------------------------------------------------ state
    def momentum_fp32(self, name: str) -> torch.Tensor | None:
        """The momentum of ``name`` as the step uses it (decoded in ``"cpu8"``), on the CPU."""
        self._sync()
        if self.mode == "cpu8":
            pkt = self.momentum_q.get(name)
            return None if pkt is None else self.codec.decompress(pkt)
        buf = self.momentum.get(name)
        return None if buf is None else buf.detach().to("cpu", copy=True)

    def anchor_state(self) -> dict[str, torch.Tensor]:
        """Copies of the anchor (on its home)."""
        self._sync()
        return {n: t.clone() for n, t in self.anchor.items()}

    def outer_state(self) -> dict[str, Any]:
        """Hyper-parameters and momentum as stored, in ``OuterSGD.state_dict``'s layout.

        ``buffers``: fp32 tensors (``"device"``, ``"cpu"``); ``buffers_int8`` (``"cpu8"``): per name
        ``{"codes": int8 [numel], "scales": float32 [blocks], "block": int}``.
        """
        self._sync()
        state: dict[str, Any] = {
            "lr": self.outer.lr,
            "momentum": self.outer.momentum,
            "nesterov": self.outer.nesterov,
            "buffers": {n: t.clone() for n, t in self.momentum.items()},
        }
        if self.mode == "cpu8":
            state["buffers_int8"] = {n: _packet_state(p) for n, p in self.momentum_q.items()}
        return state

    @torch.no_grad()
    def load(self, anchor: Mapping[str, torch.Tensor], outer: Mapping[str, Any]) -> None:
        """Restore ``anchor_state()``/``outer_state()`` output saved in any mode.

        The caller has checked the anchor's names and shapes. Nothing changes when this raises.

        Raises:
            ConfigError: a momentum of an unknown name or a wrong shape, or 8-bit codes that do not
                decode.
        """
        hyper = saved_hyperparameters(outer)
        fp = {str(k): v for k, v in dict(outer.get("buffers", {})).items()}
        q = {
            str(k): _packet_from_state(v, k, self.shapes)
            for k, v in dict(outer.get("buffers_int8", {})).items()
        }
        for n, t in fp.items():
            if n not in self.shapes or tuple(t.shape) != self.shapes[n]:
                raise ConfigError(f"outer state: momentum {n!r} is not a parameter of this shape")
        self._sync()
        new_anchor = {n: self._home(n, anchor[n].detach()) for n in self.shapes}
        momentum: dict[str, torch.Tensor] = {}
        momentum_q: dict[str, Packet] = {}
        if self.mode == "cpu8":
            momentum_q.update(q)
            momentum_q.update({n: self.codec.compress(t.detach().float().cpu()) for n, t in fp.items()})
        else:
            decoded = {n: self.codec.decompress(p) for n, p in q.items()}
            momentum.update({n: self._home(n, t.detach()) for n, t in {**fp, **decoded}.items()})
        self.outer.lr, self.outer.momentum, self.outer.nesterov = hyper
        self.anchor.clear()
        self.anchor.update(new_anchor)
        self.momentum, self.momentum_q = momentum, momentum_q


def _packet_state(p: Packet) -> dict[str, Any]:
    codes, scales = p.buffers
    return {
        "codes": torch.from_numpy(np.frombuffer(codes, dtype=np.int8).copy()),
        "scales": torch.from_numpy(np.frombuffer(scales, dtype="<f4").copy()),
        "block": int(p.param("block")),
    }


def _packet_from_state(state: Any, name: object, shapes: Mapping[str, tuple[int, ...]]) -> Packet:
    """An ``int8`` packet from ``_packet_state`` output, decoded once to check it is well-formed."""
    n = str(name)
    if n not in shapes:
        raise ConfigError(f"outer state: 8-bit momentum {n!r} is not a parameter")
    try:
        st = dict(state)
        codes = st["codes"].detach().cpu().to(torch.int8).contiguous().numpy().tobytes()
        scales = st["scales"].detach().cpu().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        pkt = Packet("int8", shapes[n], "float32", (codes, scales), (("block", int(st["block"])),))
        Int8Compressor(block=MOMENTUM_BLOCK).decompress(pkt)
    except (KeyError, TypeError, ValueError, AttributeError, ProtocolError) as e:
        raise ConfigError(f"outer state: 8-bit momentum {n!r} does not decode: {e}") from None
    return pkt
