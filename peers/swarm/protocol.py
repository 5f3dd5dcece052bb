"""The wire of SWARM stage requests: what a trainer sends a stage server and what it answers.

One request per stream, on the project's framed streams (``peers.wire.messages``):

* trainer -> server: a header (:class:`peers.wire.messages.Envelope`: ``type`` ``sw_fwd`` or ``sw_bwd``,
  ``run``, ``kind`` ``activations``/``gradients``, ``round`` = the micro-batch ID, ``index`` = the
  stage) and its data frames, each one packet in the safe wire format
  (:mod:`swarmtrain.core.wire`):

  - ``sw_fwd`` to stage 0: ``[tokens]``; to a middle stage: ``[hidden]``; to the last stage:
    ``[hidden, targets]`` (the last stage runs forward, loss and backward in one request);
  - ``sw_bwd`` (not to the last stage): ``[input, grad_output]``; the server recomputes its forward
    from ``input`` (activation recomputation, as in hivemind's RemoteExpert), so it keeps no state
    between a micro-batch's forward and backward and any replica of the stage can serve either.

* server -> trainer: one ack frame (``peers.wire.messages.encode_ack``; a refusal says why and ends the
  stream), then a header ``sw_out`` and its frames: the stage output (``sw_fwd``), the gradient of
  the input (``sw_bwd`` after stage 0, ``sw_fwd`` to the last stage), or nothing (``sw_bwd`` to
  stage 0). The last stage puts the loss in the header's ``note`` (a float's ``repr``).

* a step request (trainer -> every server of every stage): ``sw_fwd`` of kind ``steps`` without
  frames (the message types are fixed in ``peers.wire.messages``; :func:`is_step`), ``round`` = the step,
  ``note`` = ``"<servers>,<completed>"`` (:func:`encode_step_note`: how many servers of the stage the
  trainer sees, how many of its micro-batches of the step completed): the trainer fed all its
  micro-batches of this optimizer step. A server answers once the step is applied (``note`` = its new
  version): when every trainer closed it, the stage's servers sum the gradients they accumulated
  and all take the same optimizer step (``peers.swarm.server``). A sum that holds fewer
  micro-batches than the trainers completed takes no step: the answer's version is unchanged, and
  the trainers close the step again (``peers.swarm.steps``).

* a holds request (trainer -> a server, before it closes a step): ``sw_fwd`` of kind ``holds``
  without frames (:func:`is_holds`), ``round`` = a micro-batch ID; the answer's ``note`` is ``1``
  when the server holds that micro-batch's parameter gradients for the coming step, else ``0``.
  A trainer that finds a micro-batch's gradients gone with a dead server feeds it again
  (``peers.swarm.client``).

Token IDs travel as float32 packets of codec ``none`` (exact below 2**24), so there is one packet
format; the decoder checks they are integers in ``[0, vocab)``. Hidden states and gradients travel
with any registered codec. Every check raises ``ProtocolError``: shape ``[B, T, C]`` with ``C`` the
model width, ``B`` and ``T`` within the stage's limits, finite values, sizes bounded before decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from compression import decompress_any
from peers.wire.messages import MAX_FRAME, Envelope
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.packet import Packet
from swarmtrain.core.protocols import Compressor
from swarmtrain.core.wire import decode_packet, encode_packet

__all__ = [
    "FORWARD",
    "BACKWARD",
    "REPLY",
    "STEPS",
    "HOLDS",
    "ACTIVATIONS",
    "GRADIENTS",
    "is_step",
    "is_holds",
    "PARAMS",
    "is_params",
    "check_request",
    "step_of",
    "encode_count",
    "decode_count",
    "encode_step_note",
    "decode_step_note",
    "StageLimits",
    "encode_tokens",
    "decode_tokens",
    "encode_hidden",
    "decode_hidden",
    "encode_loss",
    "decode_loss",
    "handler_name",
]

FORWARD = "sw_fwd"
BACKWARD = "sw_bwd"
REPLY = "sw_out"
#: kind of the step requests (``sw_fwd`` without frames) and their replies; their ledger kind
STEPS = "steps"
#: kind of the requests "do you hold micro-batch ``round``'s gradients?" (``sw_fwd`` without
#: frames), asked by a trainer before it closes a step; answered with a count (1: yes, 0: no)
HOLDS = "holds"
#: kind of the requests "send me your stage's parameters" (``sw_fwd`` without frames), asked by a
#: trainer to settle a disagreement of two replicas no third one can settle (``peers.swarm.verify``);
#: answered with the parameters as flat float32 packets
PARAMS = "params"
#: ledger kinds of the forward and backward requests' frames
ACTIVATIONS = "activations"
GRADIENTS = "gradients"
_MAX_COUNT = 1 << 20
_TOKEN_EXACT = 1 << 24  # float32 holds every integer below this exactly


def handler_name(run_id: str, stage: int) -> str:
    """The stream handler a server of ``stage`` listens on."""
    return f"swarmtrain.{run_id}.swarm.stage{stage}"


@dataclass(frozen=True)
class StageLimits:
    """What a stage accepts.

    Attributes:
        stage: the stage index.
        stages: number of stages.
        width: the model width ``C`` of hidden states.
        vocab: token IDs are in ``[0, vocab)``.
        max_len: longest sequence ``T`` (the model's context).
        max_batch: most rows ``B`` per micro-batch.
    """

    stage: int
    stages: int
    width: int
    vocab: int
    max_len: int
    max_batch: int

    @property
    def first(self) -> bool:
        """Stage 0 takes tokens."""
        return self.stage == 0

    @property
    def last(self) -> bool:
        """The last stage takes targets and returns the loss."""
        return self.stage == self.stages - 1

    @property
    def max_numel(self) -> int:
        """Most elements of one hidden-state tensor."""
        return self.max_batch * self.max_len * self.width

    @property
    def max_packet(self) -> int:
        """Bytes of the largest packet (fp32 hidden states plus header room)."""
        return min(MAX_FRAME, 4 * self.max_numel + 4096)

    @property
    def max_request(self) -> int:
        """Bytes of the largest request body (two packets)."""
        return 2 * self.max_packet


def encode_tokens(t: torch.Tensor) -> bytes:
    """``[B, T]`` integer token IDs as an exact float32 packet."""
    if t.dim() != 2 or t.dtype.is_floating_point:
        raise ProtocolError("tokens must be a [B, T] integer tensor")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= _TOKEN_EXACT):
        raise ProtocolError("token IDs must be in [0, 2**24)")
    data = t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()
    return encode_packet(Packet("none", tuple(t.shape), "float32", (data,)))


def _packet(data: bytes, limits: StageLimits, numel: int) -> Packet:
    return decode_packet(data, max_numel=numel, max_bytes=limits.max_packet)


def decode_tokens(data: bytes, limits: StageLimits) -> torch.Tensor:
    """``[B, T]`` int64 token IDs from a peer's packet.

    Raises:
        ProtocolError: not an exact packet of integer IDs in ``[0, vocab)`` and a shape in bounds.
    """
    p = _packet(data, limits, limits.max_batch * limits.max_len)
    if p.codec != "none" or p.dtype != "float32":
        raise ProtocolError("token IDs must travel uncompressed as float32")
    _check_bt(p.shape[:2] if len(p.shape) == 2 else (), limits, "tokens")
    t = decompress_any(p)
    if not bool(torch.all(t == torch.round(t))) or (t.numel() and (t.min() < 0 or t.max() >= limits.vocab)):
        raise ProtocolError(f"token IDs must be integers in [0, {limits.vocab})")
    return t.to(torch.int64)


def _check_bt(bt: tuple[int, ...], limits: StageLimits, what: str) -> None:
    if len(bt) != 2 or not 1 <= bt[0] <= limits.max_batch or not 1 <= bt[1] <= limits.max_len:
        raise ProtocolError(
            f"{what}: expected [B<={limits.max_batch}, T<={limits.max_len}, ...], got {list(bt)}"
        )


def encode_hidden(t: torch.Tensor, compressor: Compressor, key: str = "") -> bytes:
    """A ``[B, T, C]`` float tensor (hidden states or their gradient) through ``compressor``."""
    return encode_packet(compressor.compress(t.detach().float().contiguous(), key=key))


def decode_hidden(data: bytes, limits: StageLimits, expect: tuple[int, int] | None = None) -> torch.Tensor:
    """A ``[B, T, C]`` float32 tensor from a peer's packet (any registered codec).

    Args:
        data: the packet bytes.
        limits: the stage's bounds (``C`` must equal ``limits.width``).
        expect: the ``(B, T)`` the tensor must have (e.g. those of the request's tokens).

    Raises:
        ProtocolError: bad packet, wrong shape, or non-finite values.
    """
    p = _packet(data, limits, limits.max_numel)
    if len(p.shape) != 3 or p.shape[2] != limits.width:
        raise ProtocolError(f"hidden states must be [B, T, {limits.width}], got {list(p.shape)}")
    _check_bt(p.shape[:2], limits, "hidden states")
    if expect is not None and tuple(p.shape[:2]) != tuple(expect):
        raise ProtocolError(f"hidden states are {list(p.shape[:2])}, expected {list(expect)}")
    t = decompress_any(p).float()
    if tuple(t.shape) != tuple(p.shape):
        raise ProtocolError("decoded tensor does not have the packet's shape")
    if not bool(torch.isfinite(t).all()):
        raise ProtocolError("hidden states hold NaN or infinite values")
    return t


def encode_loss(loss: float) -> str:
    """The last stage's loss for a reply header's ``note``."""
    return repr(float(loss))


def decode_loss(note: str) -> float:
    """The loss a last stage reported.

    Raises:
        ProtocolError: not a finite, non-negative float.
    """
    if len(note) > 64:
        raise ProtocolError("loss note too long")
    try:
        v = float(note)
    except ValueError:
        raise ProtocolError("loss note is not a float") from None
    if not math.isfinite(v) or v < 0:
        raise ProtocolError("loss must be finite and >= 0")
    return v


def is_step(env: Envelope) -> bool:
    """Whether a request header is a step request rather than a forward."""
    return env.type == FORWARD and env.kind == STEPS


def is_holds(env: Envelope) -> bool:
    """Whether a request header asks if the server holds a micro-batch's gradients."""
    return env.type == FORWARD and env.kind == HOLDS


def is_params(env: Envelope) -> bool:
    """Whether a request header asks for the server's stage parameters (a trainer's referee check)."""
    return env.type == FORWARD and env.kind == PARAMS


def check_request(env: Envelope, lim: StageLimits, run_id: str) -> None:
    """Refuse a request header that is not for this run and stage, not a known request type, carries
    the wrong number or kind of frames, or announces more bytes than the stage accepts (checked
    before any of its body is read).

    Raises:
        ProtocolError: naming the problem.
    """
    if env.run != run_id or env.index != lim.stage:
        raise ProtocolError("request for another run or stage")
    if env.type not in (FORWARD, BACKWARD) or env.round < 0:
        raise ProtocolError(f"unexpected request type {env.type[:16]!r}")
    if is_step(env):
        if env.frames or env.nbytes or env.kind != STEPS:
            raise ProtocolError("a step request carries no frames")
        decode_step_note(env.note)
        return
    if is_holds(env) or is_params(env):
        if env.frames or env.nbytes:
            raise ProtocolError(f"a {env.kind} request carries no frames")
        return
    if env.type == BACKWARD and lim.last:
        raise ProtocolError("the last stage runs backward within its forward request")
    want = 2 if env.type == BACKWARD or lim.last else 1
    kind = GRADIENTS if env.type == BACKWARD else ACTIVATIONS
    if env.frames != want or env.kind != kind:
        raise ProtocolError(f"{env.type} to stage {lim.stage} carries {want} frames of kind {kind}")
    if env.nbytes > lim.max_request:
        raise ProtocolError(f"request of {env.nbytes} bytes exceeds the stage's {lim.max_request}")


def step_of(mb_id: int, trainers: int, per_step: int) -> int:
    """The optimizer step a run-wide micro-batch belongs to: trainer ``t`` of ``trainers`` feeds the
    run-wide IDs ``i * trainers + t`` and closes a step after each ``per_step`` of its own."""
    if trainers < 1 or per_step < 1 or mb_id < 0:
        raise ProtocolError("step_of needs trainers >= 1, per_step >= 1 and a micro-batch ID >= 0")
    return (mb_id // trainers) // per_step


def encode_count(n: int) -> str:
    """A small count (servers of a stage, a version) for a header's ``note``."""
    return str(int(n))


def decode_count(note: str) -> int:
    """A count a peer put in a header's ``note``.

    Raises:
        ProtocolError: not a decimal integer in ``[0, 2**20]``.
    """
    if not 1 <= len(note) <= 8 or not (note.isascii() and note.isdigit()):
        raise ProtocolError("count note is not a small decimal integer")
    v = int(note)
    if v > _MAX_COUNT:
        raise ProtocolError("count note out of range")
    return v


def encode_step_note(servers: int, completed: int) -> str:
    """A step request's ``note``: servers of the stage the trainer sees, its micro-batches of the
    step that completed."""
    return f"{encode_count(servers)},{encode_count(completed)}"


def decode_step_note(note: str) -> tuple[int, int]:
    """``(servers, completed)`` from a step request's ``note``.

    Raises:
        ProtocolError: not two small counts, or no server.
    """
    parts = note.split(",")
    if len(parts) != 2:
        raise ProtocolError("a step note is '<servers>,<completed>'")
    servers, completed = decode_count(parts[0]), decode_count(parts[1])
    if servers < 1:
        raise ProtocolError("a step request names at least one server of the stage")
    return servers, completed
