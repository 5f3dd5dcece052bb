"""Preemption hand-off: what a peer does between SIGTERM and its exit.

A spot instance gets a notice (SIGTERM) and ``peers.preempt_grace`` seconds before it is killed. In
that time the peer

1. says it is leaving (``leaving = 1`` in its peer record), so no other leaving peer counts on it;
2. finishes the step it is in (a round under way completes or fails as usual) and, when the next
   sync and its round fit in the time left, trains on to that sync so its local work since the last
   one is contributed rather than dropped;
3. hands off the run's committed state: it keeps serving its state until as many live peers that are
   not leaving as the run's ``state_vouchers`` (fewer when fewer stay) announce a state at least as
   fresh as its own (:func:`handoff_status`): a newcomer takes a state only when that many donors
   vouch for it, so one committer left alone with it would leave it unadoptable. A peer that stays
   vouches for a state it downloaded once enough donors vouched for it (``peer_state.vouchable``).
   When the peers that stay already have it (the common case) this costs one DHT read; when they are
   behind (late for the last round, still downloading) it waits for them to take it from this peer.
   With nobody staying there is nobody to hand to: its saved state file keeps it for its restart;
4. withdraws its state announcement and its peer record and exits.

A watchdog armed by the signal ends the process (exit code 1, one error line) at the end of the grace
whatever the steps above are doing: a preempted peer never outlives its notice. Its ``last_words``
(``join`` writes its ``--json`` summary there) run just before that exit.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import msgpack

__all__ = [
    "Preemption",
    "finish_sync",
    "handoff_status",
    "announced_rounds",
    "withdraw_announcement",
    "LEAVE_RESERVE_S",
]

logger = logging.getLogger(__name__)

#: seconds of the grace kept for leaving itself (withdrawing records, stopping the DHT and p2pd)
LEAVE_RESERVE_S = 8.0
#: seconds between two looks at the other peers while waiting for the hand-off
HANDOFF_POLL_S = 0.5
#: consecutive reads that must find a holder before the hand-off counts as done
CONFIRM_READS = 2

HandOff = Literal["done", "wait", "alone"]


def finish_sync(seconds_to_sync: float | None, round_s: float, left_s: float) -> bool:
    """Whether a peer told to leave trains on to its next sync: when the steps to it
    (``seconds_to_sync``, ``None``: unknown) and the round itself (``round_s``) end within ``left_s``."""
    if seconds_to_sync is None or seconds_to_sync < 0 or round_s < 0:
        return False
    return seconds_to_sync + round_s <= left_s


def handoff_status(
    own_id: str,
    own_round: int,
    trainers: Iterable[tuple[str, bool]],
    announced: Mapping[str, int],
    holders: int = 1,
) -> HandOff:
    """Whether a leaving peer's state of round ``own_round`` is safe with the peers that stay.

    Args:
        own_id: the leaving peer's ID.
        own_round: the round of the state it announces (the next round after its last commit).
        trainers: ``(peer ID, leaving)`` of the run's live trainers.
        announced: peer ID -> round of the state it announces.
        holders: how many peers that stay must hold it (fewer when fewer stay): the run's
            ``state_vouchers``, so that a newcomer still finds enough donors vouching for it.

    Returns:
        ``"done"``: ``min(holders, staying)`` trainers that stay announce a state of ``own_round`` or
        later; ``"wait"``: some stay but not enough have it yet; ``"alone"``: no trainer stays
        (nobody to hand to).
    """
    staying = {p for p, leaving in trainers if p != own_id and not leaving}
    if not staying:
        return "alone"
    have = sum(1 for p in staying if announced.get(p, -1) >= own_round)
    if have >= min(max(holders, 1), len(staying)):
        return "done"
    return "wait"


def announced_rounds(node: Any, timeout: float = 10.0) -> dict[str, tuple[int, bool]]:
    """Peer ID -> (round of the state it announces, whether it announces it is leaving); withdrawn
    and malformed announcements left out."""
    from peers.state.state_transfer import parse_announcement, state_key
    from swarmtrain.core.safe_msgpack import unpack

    try:
        found = node.dht.get(state_key(node.run_id), latest=True, return_future=True).result(timeout)
    except TimeoutError:
        return {}
    if found is None or not isinstance(found.value, dict):
        return {}
    out: dict[str, tuple[int, bool]] = {}
    for peer, item in found.value.items():
        try:
            rnd = parse_announcement(item.value)[2]  # checks the bounds before the second decode
            obj = unpack(item.value, what="state announcement", max_bytes=1024, max_bin=64, max_array=8)
        except Exception:  # a withdrawn or malformed announcement: not a holder
            continue
        out[str(peer)] = (rnd, obj.get("leaving") is True)
    return out


def withdraw_announcement(node: Any, ttl: float = 61.0) -> None:
    """Replace this peer's state announcement by a tombstone that outlives it (a newer expiration
    wins in the DHT), so newcomers do not ask a peer that left. Best effort: logged on failure."""
    from peers.dht.node import dht_time
    from peers.state.state_transfer import state_key

    value = msgpack.packb({"left": True}, use_bin_type=True)
    try:
        fut = node.dht.store(
            state_key(node.run_id), value, dht_time() + ttl, subkey=node.peer_id, return_future=True
        )
        fut.result(5.0)
    except Exception as e:
        logger.info("withdrawing the state announcement failed: %s", e)


class Preemption:
    """The grace clock of one peer: armed by the first stop signal, it bounds every step of leaving
    and ends the process when the grace is over.

    Args:
        grace: seconds from the signal to the exit (``peers.preempt_grace``).

    Attributes:
        last_words: called by the watchdog right before it ends the process (a failure is logged).
    """

    def __init__(self, grace: float) -> None:
        if grace <= 0:
            raise ValueError("grace must be > 0")
        self.grace = grace
        self.last_words: Callable[[], None] | None = None
        #: ``time.monotonic()`` of the first signal (set from the signal handler: one assignment)
        self.signalled_at: float | None = None
        self._watchdog: threading.Thread | None = None

    @property
    def reserve(self) -> float:
        """Seconds kept at the end of the grace for leaving itself."""
        return min(LEAVE_RESERVE_S, self.grace / 3.0)

    def on_signal(self, signum: int) -> None:
        """Signal handler hook (``GracefulExit(on_signal=...)``): note the time; nothing that locks."""
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()

    def arm(self) -> None:
        """Start the watchdog thread (idle until a signal arrives)."""
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="swarmtrain-preempt", daemon=True)
            self._watchdog.start()

    def left(self) -> float:
        """Seconds until the work of leaving must be over (the grace less the reserve); inf before
        a signal."""
        if self.signalled_at is None:
            return float("inf")
        return self.signalled_at + self.grace - self.reserve - time.monotonic()

    def _watch(self) -> None:
        while self.signalled_at is None:
            time.sleep(0.2)
        end = self.signalled_at + self.grace - 0.5
        while (wait := end - time.monotonic()) > 0:
            time.sleep(min(wait, 1.0))
        logger.error("the %.0f s preemption grace is over: exiting now", self.grace)
        if self.last_words is not None:
            try:
                self.last_words()
            except Exception as e:
                logger.error("the last words before the exit failed: %s", e)
        logging.shutdown()
        os._exit(1)

    def hand_off(self, node: Any, own_round: int | None, holders: int = 1) -> HandOff:
        """Wait (within the grace) until ``holders`` live peers that stay (fewer when fewer stay)
        announce the state of ``own_round`` or later; returns how it ended (``"wait"``: the grace ran
        out first, logged as a warning)."""
        if own_round is None:
            return "done"  # nothing announced: nothing of ours to hand off
        said, confirmed = False, 0
        while True:
            try:
                records = node.live_peers(timeout=max(min(self.left(), 10.0), 1.0))
            except Exception as e:
                logger.warning("preemption: the DHT did not list the peers (%s); leaving", e)
                return "wait"
            found = announced_rounds(node)
            announced = {p: r for p, (r, _) in found.items()}
            # leaving by its record or by its announcement: a read of either may lag (one stale
            # subkey of a DHT dictionary), both lagging together is rarer
            trainers = [
                (r.peer_id, bool(r.extra.get("leaving")) or found.get(r.peer_id, (0, False))[1])
                for r in records
                if r.role == "trainer"
            ]
            status = handoff_status(node.peer_id, own_round, trainers, announced, holders)
            confirmed = confirmed + 1 if status == "done" else 0
            if status == "done" and confirmed < CONFIRM_READS and self.left() > HANDOFF_POLL_S:
                time.sleep(HANDOFF_POLL_S)  # a second read, so one stale record does not decide
                continue
            if status == "alone":
                logger.warning("preemption: no peer stays to take round %d's state", own_round)
            if status == "done":
                staying = [
                    f"{p[:12]}@{announced.get(p)}" for p, gone in trainers if not gone and p != node.peer_id
                ]
                logger.info("preemption: peers that stay hold round %d's state (%s)", own_round, staying)
            if status != "wait":
                return status
            if not said:
                said = True
                logger.info(
                    "preemption: serving round %d's state until enough peers that stay have it", own_round
                )
            if self.left() <= 0:
                logger.warning("preemption: no peer that stays took round %d's state in time", own_round)
                return status
            time.sleep(HANDOFF_POLL_S)
