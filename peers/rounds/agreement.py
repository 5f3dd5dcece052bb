"""Commit agreement for collective rounds: one tiny "have-all" exchange before a round commits.

Without it, a butterfly round's outcome is decided by each member alone: a member that holds every
aggregate commits, while a member that misses one (its owner died mid-send, a stream broke, the
deadline passed) fails, and the abort it sends is best effort: the members' parameters then diverge.

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

from peers.rounds.round_errors import WrongGroup
from peers.rounds.round_io import RoundIO
from peers.wire.mailbox import Key

__all__ = ["HAVE", "MIN_WAIT", "agree"]

HAVE = "have"  # the message type
MIN_WAIT = 1.0  # seconds the agreement waits at least, even past the round's deadline
_POLL = 1.0  # seconds between connectivity checks: the exchange itself takes milliseconds


def agree(io: RoundIO) -> None:
    """Announce that this peer holds the round's full result; return once every member did the same.

    Only *other* members' aborts count here, not this peer's own failed sends: once it holds the full
    result, a send of its own that failed is the receiver's problem, and the receiver says so through
    its own abort or a missing ``have``.

    Args:
        io: the round (its deadline bounds the wait, which lasts at least :data:`MIN_WAIT` seconds).

    Raises:
        MemberAborted: a member aborted first.
        RoundTimeout: a member's ``have`` did not arrive in time.
        MemberGone: a member without its ``have`` disconnected.
        WrongGroup: a ``have`` carries another group's digest.
    """
    if not io.others:
        return
    keys: list[Key] = [(HAVE, p, 0) for p in io.others]
    io.check_aborts(own_failures=False)  # a member already gave up: say nothing
    until = max(io.deadline, time.monotonic() + MIN_WAIT)
    io.send_to_others(io.envelope(HAVE), [], until)  # fire and forget: a lost one fails the receiver
    slot = io.wait(
        lambda s: all(k in s for k in keys),
        lambda s: [k[1] for k in keys if k not in s],
        timeout_text=f"no commit agreement: no {HAVE}",
        until=until,
        poll=_POLL,
        own_failures=False,
    )
    for k in keys:
        if slot[k].env.digest != io.group.digest:
            raise WrongGroup(f"{HAVE} from {k[1][:12]} belongs to another group")
