"""``RoundIO``: everything one collective round does on the network, in one object.

A round's steps (the butterfly data phase in ``peers.rounds.butterfly``, the commit agreement in
``peers.rounds.agreement``, the owner check in ``peers.rounds.owner_check``, the all-gather in
``peers.rounds.collective``) never touch the collective's mailbox or streams themselves: the collective
hands each of them the round's ``RoundIO``, which knows the round's group, kind and deadline and
offers the few operations they need: build an envelope, send, wait for messages (with the abort and
connectivity checks), check a message's digest, decode a chunk, tell the others to abort, let the
outgoing messages settle, and record phase timings (``peers.rounds.phases``).

The collective provides the wire through a :class:`RoundLink` (its mailbox, its send function and a
view of the connected peers), so this module needs nothing from ``peers.rounds.collective``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

from peers.rounds.group import Group
from peers.rounds.phases import PhaseClock
from peers.rounds.round_errors import MemberAborted, MemberGone, RoundTimeout, SendFailed, WrongGroup
from peers.wire.mailbox import Delivery, Key, Mailbox
from peers.wire.messages import Envelope, decode_packet_bytes
from swarmtrain.core.errors import ProtocolError
from swarmtrain.core.protocols import Compressor

__all__ = ["RoundLink", "RoundIO", "PhaseClock", "Slot", "decode_chunk", "WAIT_SLICE"]

logger = logging.getLogger(__name__)

Slot = dict[Key, Delivery]  # one round's received messages, keyed by (type, sender, chunk)
#: seconds a wait sleeps between connectivity checks of the members it still waits for
WAIT_SLICE = 2.0
_ABORT_SEND_S = 2.0  # an abort is best effort: the peer may be gone


@dataclass(frozen=True)
class RoundLink:
    """What a round needs from its collective: identity, inbox and outbox.

    Attributes:
        peer_id: this peer's ID.
        run_id: the run every envelope names.
        mailbox: where the collective's stream handler stores what arrives.
        send: ``send(peer, env, frames, deadline)`` queues one message; the future resolves once the
            peer acknowledged it (a failed send also leaves an abort marker of this peer in the mailbox).
        connected: the peer IDs this peer has a connection to, or ``None`` when that is unknown.
    """

    peer_id: str
    run_id: str
    mailbox: Mailbox
    send: Callable[[str, Envelope, list[Any], float], Future[None]]
    connected: Callable[[], set[str] | None]


def decode_chunk(compressor: Compressor, frames: Sequence[bytes], length: int) -> torch.Tensor:
    """Decode one chunk (one frame, one packet) into a flat fp32 tensor of ``length`` elements.

    Raises:
        ProtocolError: not one frame, a packet of another shape or size, or NaN/Inf values.
    """
    if len(frames) != 1:
        raise ProtocolError(f"expected 1 frame per chunk, got {len(frames)}")
    pkt = decode_packet_bytes(frames[0])
    if tuple(pkt.shape) != (length,):
        raise ProtocolError(f"chunk shape {tuple(pkt.shape)} != ({length},)")
    try:
        t = compressor.decompress(pkt)
    except (ValueError, RuntimeError, TypeError) as e:  # a codec's own checks on peer bytes
        raise ProtocolError(f"chunk does not decode: {type(e).__name__}: {e}") from None
    if t.numel() != length:
        raise ProtocolError("decoded chunk has the wrong size")
    t = t.reshape(-1).to(torch.float32)
    # NaN/Inf make the sum non-finite; only then (or on an overflowing sum of finite values) is
    # the exact per-element check run: one read pass, no [length] bool temporary per chunk
    if not bool(torch.isfinite(t.sum())) and not bool(torch.isfinite(t).all()):
        raise ProtocolError("non-finite values")
    return t


class RoundIO:
    """The network side of one round: its group, kind and deadline, and the operations on them.

    Args:
        link: the collective's wire (see :class:`RoundLink`).
        group: the round's fixed membership.
        kind: ledger kind of the round's traffic.
        deadline: ``time.monotonic()`` by which the round must be over.
        clock: where phase timings go.
    """

    def __init__(
        self,
        link: RoundLink,
        group: Group,
        kind: str,
        deadline: float,
        clock: PhaseClock,
        counters: Counter[str] | None = None,
    ) -> None:
        self.link = link
        #: the collective's event counts across rounds (diagnostics: ``weights_over_cap``)
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self.group = group
        self.kind = kind
        self.deadline = deadline
        self.clock = clock
        #: the other members, in member order
        self.others: list[str] = [p for p in group.members if p != link.peer_id]

    @property
    def peer_id(self) -> str:
        """This peer's ID."""
        return self.link.peer_id

    @property
    def round_id(self) -> int:
        """The round number."""
        return self.group.round_id

    def mark(self, phase: str) -> None:
        """Book the time since the previous mark under ``phase`` (see :class:`PhaseClock`)."""
        self.clock.mark(phase)

    # --- sending ------------------------------------------------------------------------------------

    def envelope(self, typ: str, **fields: Any) -> Envelope:
        """A header of this round: run, kind, round and group digest filled in (``fields`` override)."""
        base: dict[str, Any] = {"digest": self.group.digest, **fields}
        return Envelope(type=typ, run=self.link.run_id, kind=self.kind, round=self.round_id, **base)

    def send(
        self, peer: str, env: Envelope, frames: Sequence[Any], deadline: float | None = None
    ) -> Future[None]:
        """Send one message to ``peer`` (by the round's deadline unless ``deadline`` is given)."""
        return self.link.send(peer, env, list(frames), self.deadline if deadline is None else deadline)

    def send_to_others(
        self, env: Envelope, frames: Sequence[Any], deadline: float | None = None
    ) -> list[Future[None]]:
        """Send the same message to every other member."""
        return [self.send(p, env, frames, deadline) for p in self.others]

    def abort(self, reason: str) -> None:
        """Tell every other member that this peer gives up the round (fire and forget)."""
        env = self.envelope("abort", note=reason[:200])
        self.send_to_others(env, [], time.monotonic() + _ABORT_SEND_S)

    def settle(self, futs: Iterable[Future[None]]) -> None:
        """Let the outgoing messages finish (bounded by the deadline) once this peer holds its result.

        A failure here no longer concerns this peer's result: the receiver either got the message or
        fails its own wait. It is logged, not raised.
        """
        for f in futs:
            try:
                f.result(timeout=max(self.deadline - time.monotonic(), 0.0))
            except Exception as e:
                logger.info("an outgoing message did not complete: %s", e)

    # --- receiving ----------------------------------------------------------------------------------

    def snapshot(self) -> Slot:
        """The round's messages received so far."""
        return self.link.mailbox.snapshot(self.kind, self.round_id)

    def wait(
        self,
        ready: Callable[[Slot], bool],
        missing: Callable[[Slot], list[str]],
        *,
        timeout_text: str,
        until: float | None = None,
        poll: float = WAIT_SLICE,
        own_failures: bool = True,
    ) -> Slot:
        """Wait until ``ready(slot)`` holds for the round's messages, a member aborts, or time is up.

        Every ``poll`` seconds without success, a member in ``missing(slot)`` that has disconnected
        fails the round early instead of at the deadline.

        Args:
            ready: the condition on the round's messages.
            missing: the members whose messages are still missing.
            timeout_text: the failure's message, followed by ``from [the missing members]``.
            until: when to give up (default: the round's deadline).
            poll: seconds between connectivity checks.
            own_failures: whether this peer's own failed sends (its abort markers) end the wait too.

        Returns:
            the round's messages once ``ready`` holds.

        Raises:
            MemberAborted, SendFailed, MemberGone, RoundTimeout.
        """
        end = self.deadline if until is None else until

        def pred(slot: Slot) -> bool:
            return self._abort_in(slot, own_failures) is not None or ready(slot)

        slot = None
        start = time.monotonic()
        while slot is None and time.monotonic() < end:
            # wait in short slices; between them, fail fast if a missing member has disconnected
            slot = self.link.mailbox.wait(self.kind, self.round_id, pred, min(end, time.monotonic() + poll))
            if slot is None and time.monotonic() - start > poll:
                self._check_connected(missing(self.snapshot()))
        if slot is None:
            late = tuple(missing(self.snapshot()))
            raise RoundTimeout(f"{timeout_text} from {[m[:12] for m in late]}", missing=late)
        self.check_aborts(slot, own_failures=own_failures)
        return slot

    def wait_keys(self, keys: list[Key], digest: bytes) -> dict[Key, Delivery]:
        """Wait for a message under every ``(type, sender, chunk)`` in ``keys``; each must carry
        ``digest``."""
        what = keys[0][0] if keys else "messages"
        slot = self.wait(
            lambda s: all(k in s for k in keys),
            lambda s: sorted({k[1] for k in keys if k not in s}),
            timeout_text=f"timed out waiting for {what}",
        )
        return {k: self.checked(slot, k, digest) for k in keys}

    def collect(self, typ: str, digest: bytes) -> dict[str, Delivery]:
        """Wait for one ``typ`` message (chunk 0) from every other member; sender -> delivery."""
        got = self.wait_keys([(typ, m, 0) for m in self.others], digest)
        return {k[1]: d for k, d in got.items()}

    def checked(self, slot: Slot, key: Key, digest: bytes) -> Delivery:
        """The message under ``key``, which must carry ``digest``.

        Raises:
            WrongGroup: it belongs to another group or tensor layout.
        """
        d = slot[key]
        if d.env.digest != digest:
            raise WrongGroup(f"{key[0]} from {key[1][:12]} belongs to another group or tensor layout")
        return d

    def check_aborts(self, slot: Slot | None = None, *, own_failures: bool = True) -> None:
        """Raise if a member aborted the round (or, with ``own_failures``, a send of ours failed).

        Raises:
            SendFailed: this peer's abort marker (one of its sends failed).
            MemberAborted: another member's abort.
        """
        d = self._abort_in(self.snapshot() if slot is None else slot, own_failures)
        if d is None:
            return
        if d.sender == self.peer_id:
            raise SendFailed(f"sending failed: {d.env.note}")
        raise MemberAborted(f"member {d.sender[:16]} aborted: {d.env.note}")

    def _abort_in(self, slot: Slot, own_failures: bool) -> Delivery | None:
        """The first abort of this round from a member (this peer's markers only if ``own_failures``)."""
        for (typ, sender, _), d in slot.items():
            if typ != "abort" or sender not in self.group.members or d.env.digest != self.group.digest:
                continue
            if own_failures or sender != self.peer_id:
                return d
        return None

    def _check_connected(self, missing: list[str]) -> None:
        """Raise ``MemberGone`` if one of ``missing`` no longer has a connection to us."""
        if not missing:
            return
        connected = self.link.connected()
        if connected is None:
            return
        gone = tuple(m for m in missing if m not in connected)
        if gone:
            raise MemberGone(f"members {[m[:12] for m in gone]} disconnected", missing=gone)

    def decode_chunk(self, compressor: Compressor, frames: Sequence[bytes], length: int) -> torch.Tensor:
        """Decode one chunk into a flat fp32 tensor of ``length`` elements (see :func:`decode_chunk`)."""
        return decode_chunk(compressor, frames, length)
