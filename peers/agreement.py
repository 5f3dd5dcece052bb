"""Commit agreement for collective rounds: one tiny "have-all" exchange before a round commits.

Without it, a butterfly round's outcome is decided by each member alone: a member that holds every
aggregate commits, while a member that misses one (its owner died mid-send, a stream broke, the
deadline passed) fails, and the abort it sends is best effort. Measured here: under a 20 Mbit/s cap
a StreamingDiLoCo round committed on 1 of 4 peers, whose parameters then diverged.

Protocol (run after a member holds and has decoded its whole result): it sends a ``have`` message
(no data frames; the round number and 16-byte group digest in its header) to every other member, and
commits only once it has received a ``have`` from *every* member. A member abort received before that
(or the deadline, or a missing member that disconnected) fails the round for it, and it then tells
the others to abort. Since a member sends ``have`` only once it holds everything, a commit anywhere
implies that every member held the full result; so the members that fail while another commits are
those that lose (or receive too late) one of these tiny messages.

Residual window (stated honestly): this is not an atomic commit. A member that has received all
``have``s commits at once; a member still missing one ``have`` when the deadline expires (a stream
that breaks or stalls exactly then, or a member killed after it sent some of its ``have``s but not
all) fails. Closing that window needs a further phase (a coordinator's decision, as in two-phase
commit, which itself blocks when the coordinator dies) and then only moves it. The window shrinks from
the whole aggregate phase (megabytes) to the one-message exchange (a few hundred bytes); strategies
that must stay identical still re-sync by state download when they notice a mismatch.

The wait is part of the round's deadline; it gets at least :data:`MIN_WAIT` seconds so a round that
finished its data phase right at the deadline can still read ``have``s that already arrived.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from peers.mailbox import Delivery, Key
from peers.messages import Envelope
from peers.rounds import Group, RoundFailed

if TYPE_CHECKING:
    from peers.collective import P2PCollective

__all__ = ["HAVE", "MIN_WAIT", "agree"]

HAVE = "have"  # the message type
MIN_WAIT = 1.0  # seconds the agreement waits at least, even past the round's deadline


def _member_abort(group: Group, me: str, slot: dict[Key, Delivery]) -> Delivery | None:
    """An abort sent by another member of ``group`` for this round, if one arrived.

    Our own local markers (a failed outgoing send, see ``P2PCollective._send``) do not count here: once
    we hold the full result, a send of ours that failed or was not acknowledged is the receiver's
    problem, and it tells us through its own abort or a missing ``have``.
    """
    for (typ, sender, _), d in slot.items():
        if typ == "abort" and sender != me and sender in group.members and d.env.digest == group.digest:
            return d
    return None


def agree(coll: P2PCollective, group: Group, kind: str, deadline: float) -> None:
    """Announce that this peer holds the round's full result; return once every member did the same.

    Args:
        coll: the collective running the round (its mailbox, sender and connection checks are used).
        group: the round's members.
        kind: ledger kind of the round.
        deadline: the round's deadline (monotonic); the wait lasts at least :data:`MIN_WAIT` seconds.

    Raises:
        RoundFailed: a member aborted first, a member's ``have`` did not arrive in time, or a member
            without its ``have`` disconnected.
    """
    me = coll.peer_id
    others = [p for p in group.members if p != me]
    if not others:
        return
    keys: list[Key] = [(HAVE, p, 0) for p in others]

    def aborted(slot: dict[Key, Delivery]) -> None:
        d = _member_abort(group, me, slot)
        if d is not None:
            raise RoundFailed(f"member {d.sender[:16]} aborted: {d.env.note}")

    aborted(coll._mailbox.snapshot(kind, group.round_id))  # a member already gave up: say nothing
    env = Envelope(type=HAVE, run=coll.run_id, kind=kind, round=group.round_id, digest=group.digest)
    until = max(deadline, time.monotonic() + MIN_WAIT)
    for p in others:
        coll._send(p, env, [], until)  # fire and forget: a lost one makes the receiver fail, not us

    def ready(slot: dict[Key, Delivery]) -> bool:
        return _member_abort(group, me, slot) is not None or all(k in slot for k in keys)

    start = time.monotonic()
    slot = None
    while slot is None and time.monotonic() < until:
        slot = coll._mailbox.wait(kind, group.round_id, ready, min(until, time.monotonic() + 1.0))
        if slot is None and time.monotonic() - start > 1.0:
            have = coll._mailbox.snapshot(kind, group.round_id)
            coll._check_connected([k[1] for k in keys if k not in have])  # raises if one is gone
    if slot is None:
        have = coll._mailbox.snapshot(kind, group.round_id)
        missing = [k[1][:12] for k in keys if k not in have]
        raise RoundFailed(f"no commit agreement: no {HAVE} from {missing}")
    aborted(slot)
    for k in keys:
        if slot[k].env.digest != group.digest:
            raise RoundFailed(f"{HAVE} from {k[1][:12]} belongs to another group")
