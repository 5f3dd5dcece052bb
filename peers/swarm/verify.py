"""A trainer's check that the stage servers it routes to compute what their stage computes.

A server's reply cannot be checked against the stage's parameters (the trainer holds none), but
the replicas of a stage step together and hold bit-identical parameters (``peers.swarm.steps``), so
the same request answered by two of them must give the same output up to floating-point
reordering. A trainer sends a sampled share of its requests (each server's first reply to it, then
each request with probability ``rate``) once more to another replica of the stage, marked
:data:`VERIFY`: that replica computes the reply without accumulating any gradient
(``peers.swarm.stage_compute``), so a check changes no step. Outputs are compared by relative L2
error (:func:`agree`, within :data:`RTOL`; the last stage's loss within :data:`LOSS_RTOL`).

A disagreement cannot say by itself which of two replies is wrong. The trainer asks a third replica
of the stage when there is one (:func:`judge`): the reply that differs from the two others is the
liar's, and that server is convicted (:class:`ReplicaCheck`): left out of this trainer's routing
for the rest of the run and listed in its report; the micro-batch goes on with the majority's
reply. With no third replica the dispute stays open (both servers are noted, neither is excluded,
the micro-batch goes on with the first reply): excluding both would empty the stage, and trusting
either one would let a liar convict an honest server by accusing it. The decision and its reasons
are in docs/decisions.md.

Pure apart from the caller's requests: :class:`ReplicaCheck` takes the random source.
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

import torch

__all__ = [
    "VERIFY",
    "RTOL",
    "LOSS_RTOL",
    "agree",
    "agree_loss",
    "judge",
    "ReplicaCheck",
    "params_frames",
    "module_frames",
    "params_from_frames",
]

#: the ``note`` of a request that is a check: computed without accumulating gradients
VERIFY = "verify"
#: largest relative L2 difference of two replicas' outputs that is still agreement (fp32 outputs of
#: bit-identical parameters differ by ~1e-7 relative; a lossy codec's re-encoding by ~1e-2 at most)
RTOL = 0.05
#: largest relative difference of two replicas' losses that is still agreement
LOSS_RTOL = 1e-3


def agree(a: torch.Tensor, b: torch.Tensor, rtol: float = RTOL) -> bool:
    """Whether two replies (tensors of one shape) agree within ``rtol`` relative L2 error."""
    if a.shape != b.shape:
        return False
    scale = max(float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b)), 1e-12)
    return float(torch.linalg.vector_norm(a - b)) <= rtol * scale


def agree_loss(a: float, b: float, rtol: float = LOSS_RTOL) -> bool:
    """Whether two losses agree within ``rtol`` relative difference."""
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-6)


def judge(ab: bool, ac: bool, bc: bool) -> str | None:
    """Which of three replies ``a``, ``b`` and ``c`` is the odd one out, given which pairs agree:
    ``"a"``, ``"b"`` or ``"c"``; ``"all"`` when no two agree; ``None`` when all three agree."""
    if ab and ac and bc:
        return None
    if bc and not ab and not ac:
        return "a"
    if ac and not ab and not bc:
        return "b"
    if ab and not ac and not bc:
        return "c"
    return "all"


@dataclass
class ReplicaCheck:
    """One trainer's checks of stage servers (see the module docstring).

    Attributes:
        rate: probability that a reply of a server already checked once is checked again.
        checked: replies checked against another replica.
        mismatches: checks whose two replies disagreed.
        convicted: servers left out of routing -> why (the stage and the decision).
        disputes: disagreements no third replica could settle, as ``(stage, peer_a, peer_b)``.
    """

    rate: float
    checked: int = 0
    mismatches: int = 0
    convicted: dict[str, str] = field(default_factory=dict)
    disputes: list[tuple[int, str, str]] = field(default_factory=list)
    _first: set[str] = field(default_factory=set)  # servers whose first reply was checked

    @property
    def on(self) -> bool:
        """Whether any reply is checked (``rate > 0``)."""
        return self.rate > 0

    def wants(self, peer: str, rng: random.Random) -> bool:
        """Whether ``peer``'s reply should be checked: its first one, then with probability ``rate``."""
        if not self.on:
            return False
        if peer not in self._first:
            return True
        return rng.random() < self.rate

    def checked_once(self, peer: str) -> None:
        """``peer``'s reply was compared with another replica's (its first check is done)."""
        self._first.add(peer)
        self.checked += 1

    def convict(self, peer: str, why: str) -> None:
        """Leave ``peer`` out of routing for the rest of the run."""
        self.convicted.setdefault(peer, why)


#: floats per frame of a stage's parameters (:func:`params_frames`; 8 MiB, below the frame cap)
PARAMS_CHUNK = 1 << 21


def params_frames(flat: torch.Tensor) -> list[bytes]:
    """A stage's parameters (one flat float32 vector, in ``module.parameters()`` order) as packets of
    at most :data:`PARAMS_CHUNK` floats: a server's answer to a ``params`` request."""
    from swarmtrain.core.packet import Packet
    from swarmtrain.core.wire import encode_packet

    flat = flat.detach().to(torch.float32).contiguous().cpu()
    out = []
    for i in range(0, max(1, flat.numel()), PARAMS_CHUNK):
        part = flat[i : i + PARAMS_CHUNK]
        out.append(encode_packet(Packet("none", (part.numel(),), "float32", (part.numpy().tobytes(),))))
    return out


def module_frames(module: torch.nn.Module, lock: threading.Lock) -> list[bytes]:
    """``module``'s parameters as :func:`params_frames`, read under ``lock`` (between requests)."""
    with lock:
        flat = torch.cat([p.detach().reshape(-1).float().cpu() for p in module.parameters()])
    return params_frames(flat)


def params_from_frames(frames: list[bytes], numel: int) -> torch.Tensor:
    """The flat parameters a server sent (:func:`params_frames`), checked to hold exactly ``numel``
    finite float32 values.

    Raises:
        ProtocolError: another count, codec or dtype, or a non-finite value.
    """
    from compression import decompress_any
    from swarmtrain.core.errors import ProtocolError
    from swarmtrain.core.wire import decode_packet

    if len(frames) != max(1, -(-numel // PARAMS_CHUNK)):
        raise ProtocolError(f"{len(frames)} parameter frames for {numel} parameters")
    parts = []
    for f in frames:
        p = decode_packet(f, max_numel=PARAMS_CHUNK, max_bytes=4 * PARAMS_CHUNK + 4096)
        if p.codec != "none" or p.dtype != "float32" or len(p.shape) != 1:
            raise ProtocolError("parameters must travel as flat float32 packets of codec none")
        parts.append(decompress_any(p).float().reshape(-1))
    flat = torch.cat(parts) if parts else torch.zeros(0)
    if flat.numel() != numel or not bool(torch.isfinite(flat).all()):
        raise ProtocolError(f"expected {numel} finite parameters, got {flat.numel()}")
    return flat
