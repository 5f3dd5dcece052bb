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

Keys name *what* is compressed, never where it sits in a message. ``compress(t, key=...)`` keeps one
memory tensor of ``t``'s shape per key. ``compress_span(t, key=..., lo=..., total=...)`` compresses
elements ``[lo, lo + t.numel())`` of a flat vector of ``total`` elements named ``key`` (the
collective's butterfly names the concatenation of the tensors it reduces, by their names and shapes,
and cuts it into chunks that depend on the group size): its memory is one flat ``[total]`` vector per
key and each call reads and writes only its range, so the memory of an element stays that element's
whatever the chunking, and a new group size (a membership change) re-cuts the same residuals instead
of leaving stale, mis-shaped ones behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from compression.base import Codec
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.packet import Packet
from swarmtrain.core.protocols import (
    FeedbackWrapper,
    RetainingCompressor,
    RoundTransactions,
    SpanCompressor,
    StatefulCompressor,
)

__all__ = ["ErrorFeedback", "EF21"]


def _inner_state(inner: Codec) -> dict[str, Any]:
    return dict(inner.state_dict()) if isinstance(inner, StatefulCompressor) else {}


def _load_inner(inner: Codec, state: Mapping[str, Any]) -> None:
    if isinstance(inner, StatefulCompressor) and state:
        inner.load_state_dict(state)


class _Stateful(Codec, RoundTransactions, SpanCompressor, RetainingCompressor, StatefulCompressor):
    """Per-key tensor memory shared by both wrappers."""

    inner: Codec

    def __init__(self, inner: Codec) -> None:
        super().__init__(inner.device)
        if isinstance(inner, _Stateful):
            raise ConfigError("error feedback wrappers do not nest")
        self.inner = inner  # decodes (any peer's packets) and, stateless, encodes aggregates elsewhere
        # What compress encodes with: a contraction (ternary is scaled; Codec.for_error_feedback), or
        # the memory would grow without bound. Its packets are ``inner``'s: same name and format.
        self.encoder: Codec = inner.for_error_feedback()
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

    #: dtype of the memory tensors
    _dtype: torch.dtype = torch.float64

    def _slot(self, key: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        m = self._memory.get(key)
        if m is None:
            return torch.zeros(t.shape, dtype=dtype, device=t.device)
        if m.shape != t.shape:
            raise ConfigError(f"key {key!r} was used for shape {tuple(m.shape)}, now {tuple(t.shape)}")
        return m.to(t.device)

    def _flat(self, key: str, total: int, device: torch.device) -> torch.Tensor:
        """``key``'s flat ``[total]`` memory, writable in place: a private copy while a round is open
        (so ``abort_round`` can restore the tensor the round started from), zeros when new.

        Raises:
            ConfigError: ``key`` holds memory of another size.
        """
        m = self._memory.get(key)
        if m is not None and tuple(m.shape) != (total,):
            raise ConfigError(f"key {key!r} was used for shape {tuple(m.shape)}, now ({total},)")
        if m is None:
            m = torch.zeros(total, dtype=self._dtype, device=device)
        elif m.device != device or (self._undo is not None and key not in self._undo):
            m = m.to(device=device, copy=True)
        else:
            return m  # no round open, or already copied in this one
        self._store(key, m)
        return m

    def _encode(self, t: torch.Tensor, m: torch.Tensor, key: str) -> tuple[Packet, torch.Tensor]:
        """Encode ``t`` given its memory ``m`` (same shape); returns the packet and the new memory."""
        raise NotImplementedError

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        """Encode ``t`` with the memory of ``key`` (one tensor of ``t``'s shape) and update it."""
        p, new = self._encode(t, self._slot(key, t, self._dtype), key)
        self._store(key, new)
        return p

    def compress_span(self, t: torch.Tensor, *, key: str, lo: int, total: int) -> Packet:
        """Encode ``t``, elements ``[lo, lo + t.numel())`` of the flat vector ``key`` of ``total``
        elements, with the memory of those elements, and update only them.

        Raises:
            ConfigError: the range does not fit ``total``, or ``key`` holds memory of another size.
        """
        hi = lo + t.numel()
        if not 0 <= lo <= hi <= total:
            raise ConfigError(f"span [{lo}, {hi}) of key {key!r} outside its {total} elements")
        flat = self._flat(key, total, t.device)
        p, new = self._encode(t.reshape(-1), flat[lo:hi], key)
        flat[lo:hi] = new
        return p

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

    def retain(self, prefix: str, keep: str) -> None:
        """Forget the memory of every key that starts with ``prefix`` except ``keep`` (an open round's
        ``abort_round`` brings it back)."""
        for k in [k for k in self._memory if k.startswith(prefix) and k != keep]:
            if self._undo is not None and k not in self._undo:
                self._undo[k] = self._memory[k]
            del self._memory[k]

    def reset(self, key: str | None = None) -> None:
        """Forget the memory of ``key`` (or of every key)."""
        if key is None:
            self._memory.clear()
        else:
            self._memory.pop(key, None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"


class ErrorFeedback(_Stateful, FeedbackWrapper):
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

    inner: Codec

    def residual(self, key: str) -> torch.Tensor | None:
        """The current residual of ``key`` (float64), or ``None`` before its first compress."""
        return self._memory.get(key)

    def _encode(self, t: torch.Tensor, m: torch.Tensor, key: str) -> tuple[Packet, torch.Tensor]:
        """Encode ``t`` plus the residual ``m``; the new residual is what the packet dropped."""
        corrected = (t.detach().to(torch.float64) + m).to(t.dtype)
        p = self.encoder.compress(corrected, key=key)
        decoded = self.inner.decompress(p).to(t.device).reshape(t.shape)
        return p, corrected.to(torch.float64) - decoded.to(torch.float64)


class EF21(_Stateful):
    """EF21 around ``inner``: packets carry the compressed increment ``C(t - g)``.

    After ``compress(t, key)``, ``estimate(key) == old_estimate + decoded`` (float32). Receivers decode
    increments; the aggregate estimate is the running sum of the averaged increments.
    """

    sends_increments = True
    _dtype = torch.float32

    def estimate(self, key: str) -> torch.Tensor | None:
        """This peer's current estimate ``g`` of ``key`` (float32), or ``None`` before its first use."""
        return self._memory.get(key)

    def _encode(self, t: torch.Tensor, m: torch.Tensor, key: str) -> tuple[Packet, torch.Tensor]:
        """Encode the increment ``t - g`` (``g = m``); the new estimate is ``g`` plus its decode."""
        p = self.encoder.compress((t.detach().float() - m).to(t.dtype), key=key)
        inc = self.inner.decompress(p).to(device=t.device, dtype=torch.float32).reshape(t.shape)
        return p, m + inc
