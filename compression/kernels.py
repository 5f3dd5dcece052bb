"""Optional ``torch.compile`` of the codecs' elementwise kernels, warmed lazily and cached per process.

Eager torch runs a blockwise quantizer as many separate passes over memory; ``torch.compile``
(Inductor: C++/OpenMP on CPU, Triton on GPU) fuses the per-block reduction and the quantisation into
one pass, which is what brings the codecs near the memory roofline. Compiling is slow (paid per
kernel, once per process), so:

* only CPU tensors with at least ``min_numel()`` elements (default 2**22) take the compiled path, so
  small runs (and the many short-lived peer processes of the tests) never pay for compilation;
* each kernel compiles once per process, on first use, with dynamic shapes (one kernel for all sizes);
* ``SWARMTRAIN_COMPILE_CODECS=0`` disables compilation, ``=1`` forces it for every size (tests);
  ``SWARMTRAIN_COMPILE_MIN_NUMEL`` moves the threshold;
* any compile failure logs one warning and falls back to eager for the rest of the process.

Compiled and eager kernels are written with the same IEEE-exact elementwise operations (no division
by constants, which Inductor rewrites into a multiply), so both produce bit-identical packets; the
tests check it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["Kernel", "compile_mode", "min_numel", "ENV_COMPILE", "ENV_MIN_NUMEL"]

log = logging.getLogger(__name__)

ENV_COMPILE = "SWARMTRAIN_COMPILE_CODECS"
ENV_MIN_NUMEL = "SWARMTRAIN_COMPILE_MIN_NUMEL"
_DEFAULT_MIN_NUMEL = 1 << 22
# Inductor's CPU backend decides whether to parallelise a loop nest from size hints; with dynamic
# shapes and a fused [nblocks, block] reduction + pointwise nest it can judge the work too small and
# emit a single-threaded kernel. ``dynamic_threads`` always opens a parallel region and lets OpenMP
# size it at run time.
_OPTIONS: dict[str, Any] = {"cpp.dynamic_threads": True}


def compile_mode() -> str:
    """``"off"``, ``"auto"`` (default: compile above the size threshold) or ``"always"``."""
    raw = os.environ.get(ENV_COMPILE, "").strip().lower()
    if raw in ("0", "off", "false", "no"):
        return "off"
    if raw in ("1", "always", "force", "on"):
        return "always"
    return "auto"


def min_numel() -> int:
    """Element count from which the compiled path is used in ``auto`` mode."""
    raw = os.environ.get(ENV_MIN_NUMEL, "")
    try:
        return max(1, int(raw)) if raw else _DEFAULT_MIN_NUMEL
    except ValueError:
        return _DEFAULT_MIN_NUMEL


class Kernel:
    """A pure tensor function with an eager and a lazily compiled implementation.

    Args:
        fn: the eager function; it must be traceable by ``torch.compile`` with ``fullgraph=True``.
        name: for log messages.
    """

    _lock = threading.Lock()

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.name = name
        self._compiled: Callable[..., Any] | None = None
        self._failed = False

    def use_compiled(self, numel: int, cuda: bool = False) -> bool:
        """Whether a call on ``numel`` elements takes the compiled path now.

        On CUDA tensors ``auto`` stays eager: on an H200 (2026-12-04) the Triton int8 encoder gave
        bytes that differ from the CPU codec's and the compiled decoders ran at a few GB/s, while the
        eager kernels are bit-identical and far faster than the bus (``benchmarks/gpu_codecs.py``).
        """
        if self._failed:
            return False
        mode = compile_mode()
        return mode == "always" or (mode == "auto" and not cuda and numel >= min_numel())

    def __call__(self, *args: Any, numel: int) -> Any:
        cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
        if self.use_compiled(numel, cuda):
            try:
                for a in args:  # sizes vary, the block size (a closure constant) does not
                    if isinstance(a, torch.Tensor) and a.dim():
                        torch._dynamo.maybe_mark_dynamic(a, 0)
                return self._get()(*args)
            except Exception as e:  # compiler missing, unsupported device, Inductor bug: stay correct
                self._failed = True
                log.warning("torch.compile of codec kernel %s failed (%s); using eager torch", self.name, e)
        return self.fn(*args)

    def _get(self) -> Callable[..., Any]:
        with self._lock:
            if self._compiled is None:
                self._compiled = torch.compile(self.fn, fullgraph=True, options=_OPTIONS)
            return self._compiled
