"""An emulated accelerator for the CPU suite: ``torch.device("fakegpu")`` behaves like CUDA where
device mistakes show.

The test suite has no GPU, yet the bugs that matter on one are device bugs: a tensor left on the
host meeting one on the device (``Expected all tensors to be on the same device``), a ``.numpy()``
of a device tensor, a result returned on the wrong device. This module registers torch's
``PrivateUse1`` backend from Python under the name ``fakegpu`` and makes its tensors a wrapper
subclass around CPU tensors. Every op on them runs the CPU kernel on the inner tensors, but first
checks the devices the way CUDA's kernels do:

* a ``fakegpu`` tensor and a CPU tensor of one or more dimensions in one op raise the same
  ``RuntimeError`` CUDA raises (0-dim CPU tensors are scalars, allowed as on CUDA);
* ``copy_``/``.to()`` move between the two, as on CUDA;
* ``.numpy()`` of a ``fakegpu`` tensor fails, as for a CUDA tensor.

Importing this module registers the backend once per process (``tests/devices/sitecustomize.py``
imports it in every child process of a test that puts ``tests/devices`` on ``PYTHONPATH``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

__all__ = ["NAME", "DEVICE", "FakeGpuTensor", "on_fakegpu"]

NAME = "fakegpu"

if torch._C._get_privateuse1_backend_name() != NAME:
    _setup_privateuseone_for_python_backend(NAME)

DEVICE = torch.device(NAME, 0)

#: ops that legitimately take tensors of both devices (transfers)
_TRANSFERS = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}


class FakeGpuTensor(torch.Tensor):
    """A tensor on ``fakegpu:0``: a CPU tensor (``inner``) behind a wrapper that reports the device."""

    inner: torch.Tensor

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> FakeGpuTensor:
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            device=DEVICE,
            requires_grad=inner.requires_grad,
        )
        r.inner = inner
        return r

    def __repr__(self) -> str:  # type: ignore[override]
        return f"FakeGpuTensor({self.inner!r})"

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func not in _TRANSFERS:
            leaves, _ = tree_flatten((args, kwargs))
            for t in leaves:
                if isinstance(t, torch.Tensor) and not isinstance(t, FakeGpuTensor) and t.dim() > 0:
                    raise RuntimeError(
                        "Expected all tensors to be on the same device, but found at least two "
                        f"devices, {DEVICE} and {t.device}! (fakegpu: {func})"
                    )
        if func is torch.ops.aten._to_copy.default:
            dev = kwargs.get("device")
            src = args[0].inner if isinstance(args[0], FakeGpuTensor) else args[0]
            out = func(src, **{k: v for k, v in kwargs.items() if k != "device"})
            if dev is not None and torch.device(dev).type == "cpu":
                return out
            return FakeGpuTensor(out)
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        # in-place and view ops return (and, for squeeze_/t_..., reshape) the wrapper itself
        return return_and_correct_aliasing(func, args, kwargs, tree_map(_wrap, out))


def _unwrap(t: Any) -> Any:
    return t.inner if isinstance(t, FakeGpuTensor) else t


def _wrap(t: Any) -> Any:
    return FakeGpuTensor(t) if isinstance(t, torch.Tensor) and not isinstance(t, FakeGpuTensor) else t


def _empty(
    size: Any,
    dtype: Any = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> torch.Tensor:
    return FakeGpuTensor(torch.empty(size, dtype=dtype or torch.get_default_dtype()))


def _empty_strided(
    size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> torch.Tensor:
    return FakeGpuTensor(torch.empty_strided(size, stride, dtype=dtype or torch.get_default_dtype()))


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """A copy between the devices that reached the backend without the Python key (tensor factories
    such as ``torch.tensor(data, device=...)``)."""
    _unwrap(dst).copy_(_unwrap(src))
    return dst


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("_copy_from", _copy_from, "PrivateUse1")
_LIB.impl("empty.memory_format", _empty, "PrivateUse1")
_LIB.impl("empty_strided", _empty_strided, "PrivateUse1")


def on_fakegpu(t: torch.Tensor) -> bool:
    """Whether ``t`` lives on the emulated device."""
    return t.device.type == NAME
