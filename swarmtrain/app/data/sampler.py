"""Deterministic, disjoint per-peer batches: each batch is a pure function of (seed, peer, peers, step).

The training stream is cut into non-overlapping windows of ``block_size`` inputs (plus one target
byte) at a random per-epoch offset; every epoch draws one permutation of the windows from
``(seed, epoch)``. Global micro-batch ``g = (step * grad_accum + micro) * num_peers + peer_index``
takes windows ``perm[(g mod G) * B : (g mod G + 1) * B]`` of epoch ``g // G`` (``G`` batches per
epoch). So within an epoch no two micro-batches of any peers share a window, every peer's stream is
reproducible from ``(seed, peer_index)``, and the data position is just the step number, which is
what checkpoints store. Validation batches are evenly spaced windows over the held-out stream, the
same for every peer and seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from swarmtrain.core.errors import ConfigError

__all__ = ["BatchSampler", "eval_batches"]

_SALT = 0x5EED_DA7A


class BatchSampler:
    """Training batches for one peer.

    Args:
        data: 1-D token array (``uint8`` bytes or ``uint16`` tokens).
        batch_size: rows per micro-batch ``B``.
        block_size: sequence length ``T``.
        seed: run seed shared by every peer.
        peer_index: this peer's index in ``[0, num_peers)``.
        num_peers: peers sharing the data.
        grad_accum: micro-batches per step.
        vocab_size: when given, every batch is checked to hold ids below it.

    Raises:
        ConfigError: bad indices, or a corpus too small for one global batch.
    """

    def __init__(
        self,
        data: np.ndarray,
        *,
        batch_size: int,
        block_size: int,
        seed: int = 0,
        peer_index: int = 0,
        num_peers: int = 1,
        grad_accum: int = 1,
        vocab_size: int | None = None,
    ) -> None:
        if num_peers < 1 or not 0 <= peer_index < num_peers:
            raise ConfigError(f"peer_index {peer_index} is outside [0, num_peers={num_peers})")
        if batch_size < 1 or block_size < 1 or grad_accum < 1:
            raise ConfigError("batch_size, block_size and grad_accum must be positive")
        self.data = data
        self.batch_size = batch_size
        self.block_size = block_size
        self.seed = int(seed)
        self.peer_index = peer_index
        self.num_peers = num_peers
        self.grad_accum = grad_accum
        self.vocab_size = vocab_size
        # windows with any offset in [0, T) fit: o + W*T + 1 <= len(data)
        self.windows = (len(data) - block_size) // block_size if len(data) > block_size else 0
        self.batches_per_epoch = self.windows // batch_size
        if self.batches_per_epoch < 1:
            raise ConfigError(
                f"data: the training stream ({len(data)} tokens) is too small for one batch of "
                f"{batch_size} x {block_size + 1} tokens"
            )
        self._epoch_cache: tuple[int, int, np.ndarray] | None = None

    def _epoch(self, epoch: int) -> tuple[int, np.ndarray]:
        if self._epoch_cache is not None and self._epoch_cache[0] == epoch:
            return self._epoch_cache[1], self._epoch_cache[2]
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([_SALT, self.seed, epoch])))
        offset = int(rng.integers(0, self.block_size))
        perm = rng.permutation(self.windows)
        self._epoch_cache = (epoch, offset, perm)
        return offset, perm

    def global_index(self, step: int, micro: int = 0) -> int:
        """The run-wide micro-batch number of this peer's ``micro``-th micro-batch of ``step``."""
        if step < 0 or not 0 <= micro < self.grad_accum:
            raise ConfigError(f"bad batch position step={step} micro={micro}")
        return (step * self.grad_accum + micro) * self.num_peers + self.peer_index

    def starts(self, step: int, micro: int = 0) -> np.ndarray:
        """Start offsets (into ``data``) of the ``B`` windows of one micro-batch, as int64."""
        g = self.global_index(step, micro)
        epoch, j = divmod(g, self.batches_per_epoch)
        offset, perm = self._epoch(epoch)
        w = perm[j * self.batch_size : (j + 1) * self.batch_size]
        return (offset + w.astype(np.int64) * self.block_size).astype(np.int64)

    def get(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets of one micro-batch, both ``[B, T]`` int64 (CPU)."""
        t = self.block_size
        rows = np.stack([np.asarray(self.data[s : s + t + 1]) for s in self.starts(step, micro)])
        xy = torch.from_numpy(rows.astype(np.int64))  # [B, T+1]
        if self.vocab_size is not None and int(xy.max()) >= self.vocab_size:
            raise ConfigError(f"data: token id {int(xy.max())} is outside the vocab of {self.vocab_size}")
        return xy[:, :-1], xy[:, 1:]

    def identity(self) -> dict[str, Any]:
        """What determines the stream; stored in checkpoints to detect a changed setup on resume."""
        return {
            "seed": self.seed,
            "peer_index": self.peer_index,
            "num_peers": self.num_peers,
            "batch_size": self.batch_size,
            "block_size": self.block_size,
            "grad_accum": self.grad_accum,
            "tokens": int(len(self.data)),
        }


def eval_batches(
    data: np.ndarray, *, n_batches: int, batch_size: int, block_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed set of validation batches: ``n_batches * B`` windows evenly spaced over ``data``.

    The set depends on nothing but the held-out stream and the shapes, so every peer evaluates on the
    same bytes. A short stream yields fewer rows (at least one); windows may then overlap.

    Raises:
        ConfigError: the held-out stream is shorter than one window.
    """
    t = block_size
    if len(data) < t + 1:
        raise ConfigError(f"data: the validation stream ({len(data)} tokens) is shorter than {t + 1}")
    n = n_batches * batch_size
    starts = np.linspace(0, len(data) - t - 1, num=n).astype(np.int64)
    rows = np.stack([np.asarray(data[s : s + t + 1]) for s in starts]).astype(np.int64)
    xy = torch.from_numpy(rows)
    out = []
    for i in range(n_batches):
        chunk = xy[i * batch_size : (i + 1) * batch_size]
        out.append((chunk[:, :-1], chunk[:, 1:]))
    return out
