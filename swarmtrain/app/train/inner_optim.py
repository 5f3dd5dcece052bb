"""The inner optimizer every peer steps locally, and the check that a saved state fits it.

Three kinds, chosen by ``train.optimizer``:

- ``adamw``: ``torch.optim.AdamW`` (fused on CUDA), weight decay on matrices only (GPT-2/nanoGPT).
- ``adamw8bit``: bitsandbytes' ``AdamW8bit`` (Dettmers et al., "8-bit Optimizers via Block-wise
  Quantization", ICLR 2022): both moments stored as ``uint8`` codes of a dynamic quantization map,
  with one float32 absmax per block of 256 elements, so the state costs ~2 bytes per parameter
  instead of 8. Tensors under 4096 elements keep float32 moments, as in the paper. It runs on CUDA
  and on CPU. bitsandbytes is an optional dependency (the ``cuda`` extra): without it this kind is a
  one-line :class:`ConfigError`.
- ``sgd``: SGD with momentum ``beta1``.

The optimizer's ``state_dict()`` goes into checkpoints through ``swarmtrain.app.train.checkpoint``'s
``pack_state`` (safetensors + JSON, no pickle); :func:`check_optimizer_state` validates a saved
state against this optimizer (state names, shapes and dtypes per parameter) before anything is
loaded, so a state of another kind or another model is a typed error and changes nothing.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch

from swarmtrain.app.train.checkpoint import CheckpointError
from swarmtrain.core.config import Config
from swarmtrain.core.errors import ConfigError

__all__ = [
    "OPTIMIZERS",
    "INSTALL_HINT",
    "build_optimizer",
    "load_bitsandbytes",
    "check_optimizer_state",
]

logger = logging.getLogger(__name__)

OPTIMIZERS = ("adamw", "adamw8bit", "sgd")
INSTALL_HINT = 'pip install -e ".[cuda]" (or: pip install bitsandbytes)'

_BNB_WRAP = "__bnb_optimizer_quant_state__"  # bitsandbytes nests its quantization tensors under this key
_BNB_BLOCK = 256  # bitsandbytes' block size for the absmax of 8-bit optimizer states
_BNB_MIN_8BIT = 4096  # tensors with fewer elements keep float32 states (bitsandbytes' default)
_QMAP_LEN = 256  # one float32 per uint8 code


def load_bitsandbytes() -> ModuleType:
    """Import bitsandbytes (quietly) or raise one clear line.

    Raises:
        ConfigError: bitsandbytes is not installed or cannot load its native library.
    """
    # bitsandbytes' CPU backend warns at import that an optional 4-bit kernel package is missing;
    # 4-bit matmuls are not used here, so that warning is noise on every run.
    cpu_ops = logging.getLogger("bitsandbytes.backends.cpu.ops")
    level = cpu_ops.level
    cpu_ops.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():  # torch.utils.mkldnn, which it imports, uses deprecated jit APIs
            warnings.simplefilter("ignore", DeprecationWarning)
            import bitsandbytes
            import bitsandbytes.optim  # noqa: F401
    except Exception as e:  # ImportError, or OSError/RuntimeError from a broken native library
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(
            f"train.optimizer: adamw8bit needs bitsandbytes, which cannot be imported ({reason}); "
            f"install it with: {INSTALL_HINT}"
        ) from None
    finally:
        cpu_ops.setLevel(level)
    return bitsandbytes


def build_optimizer(model: torch.nn.Module, config: Config, device: torch.device) -> torch.optim.Optimizer:
    """The inner optimizer of ``config.train.optimizer`` over ``model``'s trainable parameters.

    Two parameter groups: matrices (with ``weight_decay``) and vectors (without), as GPT-2/nanoGPT.

    Raises:
        ConfigError: an unknown kind, or ``adamw8bit`` without bitsandbytes.
    """
    tc = config.train
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": tc.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if tc.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=tc.lr, momentum=tc.beta1)
    if tc.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), fused=device.type == "cuda")
    if tc.optimizer == "adamw8bit":
        bnb = load_bitsandbytes()
        opt: torch.optim.Optimizer = bnb.optim.AdamW8bit(
            groups, lr=tc.lr, betas=(tc.beta1, tc.beta2), min_8bit_size=_BNB_MIN_8BIT
        )
        return opt
    raise ConfigError(f"train.optimizer: unknown optimizer {tc.optimizer!r} (use {', '.join(OPTIMIZERS)})")


# --------------------------------------------------------------------------------- state checks
_Spec = dict[str, tuple[tuple[int, ...], torch.dtype] | type]  # state name -> (shape, dtype) or a type


def _expected(kind: str, p: torch.Tensor) -> _Spec:
    """The state entries ``kind`` keeps for parameter ``p`` once it has stepped."""
    shape = tuple(p.shape)
    if kind == "adamw":
        return {"step": ((), torch.float32), "exp_avg": (shape, p.dtype), "exp_avg_sq": (shape, p.dtype)}
    if kind == "sgd":
        return {"momentum_buffer": (shape, p.dtype)}
    if kind == "adamw8bit":
        if p.numel() < _BNB_MIN_8BIT:
            return {"step": int, "state1": (shape, torch.float32), "state2": (shape, torch.float32)}
        blocks = math.ceil(p.numel() / _BNB_BLOCK)
        return {
            "step": int,
            "state1": (shape, torch.uint8),
            "state2": (shape, torch.uint8),
            "qmap1": ((_QMAP_LEN,), torch.float32),
            "qmap2": ((_QMAP_LEN,), torch.float32),
            "absmax1": ((blocks,), torch.float32),
            "absmax2": ((blocks,), torch.float32),
        }
    raise ConfigError(f"train.optimizer: unknown optimizer {kind!r}")


def _flat_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A parameter's saved state with bitsandbytes' nested quantization dict merged in."""
    out = {k: v for k, v in entry.items() if k != _BNB_WRAP}
    wrapped = entry.get(_BNB_WRAP)
    if wrapped is not None:
        if not isinstance(wrapped, Mapping):
            raise CheckpointError(f"optimizer state: {_BNB_WRAP} is not a mapping")
        out.update(wrapped)
    return out


def check_optimizer_state(optimizer: torch.optim.Optimizer, kind: str, saved: Any) -> None:
    """Raise CheckpointError unless ``saved`` is a ``state_dict()`` of a ``kind`` optimizer over
    parameters of the same groups, shapes and dtypes as ``optimizer``'s. Reads only; changes nothing.

    Every per-parameter entry must hold exactly the state names ``kind`` keeps, each a tensor of the
    expected shape and dtype (8-bit codes ``uint8``, their absmax and quantization map ``float32``).
    A parameter without an entry (it has not stepped yet) is allowed.
    """
    if not isinstance(saved, Mapping) or not isinstance(saved.get("param_groups"), list):
        raise CheckpointError("optimizer state is not a state_dict (no param_groups)")
    groups, state = saved["param_groups"], saved.get("state", {})
    if not isinstance(state, Mapping):
        raise CheckpointError("optimizer state: 'state' is not a mapping")
    ours = [list(g["params"]) for g in optimizer.param_groups]
    theirs = [g.get("params") if isinstance(g, Mapping) else None for g in groups]
    if len(theirs) != len(ours) or any(
        not isinstance(t, list) or len(t) != len(o) for t, o in zip(theirs, ours, strict=False)
    ):
        raise CheckpointError(
            f"optimizer state has groups of {[len(t) if isinstance(t, list) else None for t in theirs]} "
            f"parameters, this optimizer {[len(o) for o in ours]}"
        )
    # state_dict() numbers parameters in group order; a saved index maps to our parameter there
    lists: list[list[Any]] = [t for t in theirs if isinstance(t, list)]  # all of them, checked above
    if not all(isinstance(i, int) and not isinstance(i, bool) for t in lists for i in t):
        raise CheckpointError("optimizer state: parameter ids are not integers")
    params = {idx: p for t, o in zip(lists, ours, strict=True) for idx, p in zip(t, o, strict=True)}
    for idx, entry in state.items():
        p = params.get(idx)
        if p is None or not isinstance(entry, Mapping):
            raise CheckpointError(f"optimizer state has an entry {idx!r} for no parameter of this model")
        got, want = _flat_entry(entry), _expected(kind, p)
        if set(got) != set(want):
            raise CheckpointError(
                f"optimizer state of parameter {idx} holds {sorted(got)}, {kind} keeps {sorted(want)} "
                "(was the checkpoint written with another train.optimizer?)"
            )
        for name, spec in want.items():
            value = got[name]
            if isinstance(spec, type):
                if not isinstance(value, spec) or isinstance(value, bool):
                    raise CheckpointError(f"optimizer state {idx}.{name} is not {spec.__name__}")
                continue
            if kind == "sgd" and value is None:  # a momentum buffer not created yet
                continue
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != spec[0] or value.dtype != spec[1]:
                desc = (
                    f"{tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value)
                )
                raise CheckpointError(
                    f"optimizer state {idx}.{name} is {desc}, expected {spec[0]} {spec[1]} ({kind})"
                )
