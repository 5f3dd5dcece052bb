"""Error feedback wrappers: ``ErrorFeedback`` (EF-SGD) and ``EF21``.

* ``ErrorFeedback`` (Seide et al. 2014; Karimireddy et al., "Error Feedback Fixes SignSGD", 2019):
  keeps, per tensor key, the part the codec dropped last time and adds it to the next input, so no
  signal is lost, only delayed. After each ``compress``: ``residual + decoded == corrected input``
  exactly (the residual is kept in float64; see the class docstring for why that is exact).
* ``EF21`` (Richtarik, Sokolov, Fatkhullin, "EF21: A New, Simpler, Theoretically Better, and
  Practically Faster Error Feedback", 2021): keeps an estimate ``g`` per key and sends the compressed
  increment ``C(t - g)``; both ends add the decoded increment to their copy of ``g``. Its packets
  therefore decode to increments, not to estimates of ``t`` (``sends_increments = True``): a
  strategy using it must keep the mirror of the aggregate itself.

Both wrap any codec, keep their state on the input's device and expose ``state_dict()``.

Rounds are transactions (``begin_round`` / ``commit_round`` / ``abort_round``): a strategy opens one
around each collective call and aborts it when the round does not commit, so the memory is left as if
the round had never been tried. Otherwise a failed round would advance the residual by a pseudo-gradient
that the next round sends again (DiLoCo retries with everything since its last good sync), counting it
twice. ``optimizers.base.reduce_or_rollback`` does this for every strategy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from compression.base import Codec
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.packet import Packet

__all__ = ["ErrorFeedback", "EF21"]


def _inner_state(inner: Codec) -> dict[str, Any]:
    fn = getattr(inner, "state_dict", None)
    return dict(fn()) if callable(fn) else {}


def _load_inner(inner: Codec, state: Mapping[str, Any]) -> None:
    fn = getattr(inner, "load_state_dict", None)
    if callable(fn) and state:
        fn(state)


class _Stateful(Codec):
    """Per-key tensor memory shared by both wrappers."""

    def __init__(self, inner: Codec) -> None:
        super().__init__(inner.device)
        if isinstance(inner, _Stateful):
            raise ConfigError("error feedback wrappers do not nest")
        self.inner = inner  # decodes (any peer's packets) and, stateless, encodes aggregates elsewhere
        # What compress encodes with: a contraction (ternary is scaled; Codec.for_error_feedback), or
        # the memory would grow without bound. Its packets are ``inner``'s: same name and format.
        hook = getattr(inner, "for_error_feedback", None)
        self.encoder: Codec = hook() if callable(hook) else inner
        self.name = inner.name  # packets are the inner codec's: any peer decodes them with it
        self._memory: dict[str, torch.Tensor] = {}
        # Open round: key -> its memory before the round (None: the key is new). None: no round open.
        self._undo: dict[str, torch.Tensor | None] | None = None

    def begin_round(self) -> None:
        """Open a round: until ``commit_round``, ``abort_round`` can undo every memory change.

        Raises:
            ConfigError: a round is already open (one collective call at a time per codec).
        """
        if self._undo is not None:
            raise ConfigError("an error-feedback round is already open; commit or abort it first")
        self._undo = {}

    def commit_round(self) -> None:
        """Keep the memory the open round wrote (a no-op without an open round)."""
        self._undo = None

    def abort_round(self) -> None:
        """Restore every key the open round touched to its memory before the round (new keys vanish)."""
        undo, self._undo = self._undo, None
        for key, old in (undo or {}).items():
            if old is None:
                self._memory.pop(key, None)
            else:
                self._memory[key] = old

    def _store(self, key: str, value: torch.Tensor) -> None:
        """Replace ``key``'s memory (never in place, so an open round can restore the old tensor)."""
        if self._undo is not None and key not in self._undo:
            self._undo[key] = self._memory.get(key)
        self._memory[key] = value

    def _slot(self, key: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        m = self._memory.get(key)
        if m is None:
            return torch.zeros(t.shape, dtype=dtype, device=t.device)
        if m.shape != t.shape:
            raise ConfigError(f"key {key!r} was used for shape {tuple(m.shape)}, now {tuple(t.shape)}")
        return m.to(t.device)

    def payload_nbytes(self, numel: int, dtype: str = "float32") -> int:
        """The inner codec's payload size."""
        return self.inner.payload_nbytes(numel, dtype)

    def decompress(self, p: Packet) -> torch.Tensor:
        """The inner codec's decode of ``p`` (stateless: safe on any peer's packets)."""
        return self.inner.decompress(p)

    def state_dict(self) -> dict[str, Any]:
        """Per-key memory tensors (on CPU) and the inner codec's state."""
        return {
            "memory": {k: v.detach().cpu().clone() for k, v in self._memory.items()},
            "inner": _inner_state(self.encoder),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore ``state_dict()`` output."""
        memory = state.get("memory", {})
        if not isinstance(memory, Mapping) or not all(isinstance(v, torch.Tensor) for v in memory.values()):
            raise ConfigError("error feedback state: 'memory' must map keys to tensors")
        self._memory = {str(k): v.clone() for k, v in memory.items()}
        self._undo = None  # the loaded state supersedes any open round
        _load_inner(self.encoder, state.get("inner", {}))

    def reset(self, key: str | None = None) -> None:
        """Forget the memory of ``key`` (or of every key)."""
        if key is None:
            self._memory.clear()
        else:
            self._memory.pop(key, None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


class ErrorFeedback(_Stateful):
    """EF-SGD residual memory around ``inner``.

    ``compress(t, key)`` encodes ``c = t + r`` (rounded to ``t``'s dtype) and stores
    ``r = c - decode(packet)``. The residual is float64: for every codec here the decoded value is
    either 0, or within a factor 2 of ``c`` (int8/int4/fp16/bf16), or ``c`` itself (top-k), or, for
    ternary, ``±s'`` with ``2**-25 s' <= |c| <= block * s'`` (``s'``: the contractive block scale,
    between ``absmax / block`` and ``absmax``) -- in each case ``c - decoded`` of two float32 numbers
    fits float64's 53 bits, so ``residual + decoded == c`` holds exactly.

    ``compress`` encodes with ``encoder = inner.for_error_feedback()``: for ternary its contractive
    twin, so the residual stays bounded (plain TernGrad's error exceeds its input and the memory would
    grow); ``inner`` itself stays the unbiased codec that decodes and that stateless users (e.g. an
    owner check's aggregate codec) encode with.
    """

    def residual(self, key: str) -> torch.Tensor | None:
        """The current residual of ``key`` (float64), or ``None`` before its first compress."""
        return self._memory.get(key)

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        """Encode ``t`` plus the remembered residual of ``key``, and remember the new residual."""
        r = self._slot(key, t, torch.float64)
        corrected = (t.detach().to(torch.float64) + r).to(t.dtype)
        p = self.encoder.compress(corrected, key=key)
        decoded = self.inner.decompress(p).to(t.device)
        self._store(key, corrected.to(torch.float64) - decoded.to(torch.float64))
        return p


class EF21(_Stateful):
    """EF21 around ``inner``: packets carry the compressed increment ``C(t - g)``.

    After ``compress(t, key)``, ``estimate(key) == old_estimate + decoded`` (float32). Receivers decode
    increments; the aggregate estimate is the running sum of the averaged increments.
    """

    sends_increments = True

    def estimate(self, key: str) -> torch.Tensor | None:
        """This peer's current estimate ``g`` of ``key`` (float32), or ``None`` before its first use."""
        return self._memory.get(key)

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        """Encode the increment ``t - g`` of ``key`` and advance ``g`` by its decoded value."""
        g = self._slot(key, t, torch.float32)
        p = self.encoder.compress((t.detach().float() - g).to(t.dtype), key=key)
        self._store(key, g + self.inner.decompress(p).to(device=t.device, dtype=torch.float32))
        return p
