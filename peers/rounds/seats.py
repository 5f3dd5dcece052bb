"""Seats for strangers under ``open``: members without history cannot stall a run's rounds.

Under ``open`` anyone may join a round, and a member that joins and then never sends its parts
stalls the whole round: every other member waits for its partition until the deadline. Two such
peers seated in every round commit nothing. Once the run has a certified history
(``peers.state.certificates``), a :class:`Seats` rule seats the members of a round by that history:

* **Established**: a peer that signed a certified commit (a quorum of its round's group signed the
  same state) announced for a round *before* the current one: certificate round ``<= r - 1``. A
  state committed in round ``k`` is announced as round ``k + 1``, so a peer that first commits
  round ``k`` counts from round ``k + 2`` on, when every member's last read holds its certificate
  (it stored it before it started round ``k + 1``; a peer reads the history after each round, out
  of the next round's join window, and at the start of its first round). All members then agree on
  who may lead, instead of racing on a certificate stored a moment ago. Remembered for the life of
  the process (a certificate record only holds its signer's last few).
* **Leader**: only an established peer leads; the leader is the smallest established joiner. A
  list published by anyone else is ignored, like a banned leader's.
* **Seats**: a list seats at most :func:`newcomer_seats` ``= max(1, established // 2)`` newcomers
  (members not established). Every member checks a list against its own view and refuses one that
  breaks the rule (:class:`TooManyNewcomers`, handled like a list naming a banned peer). A leader
  that would seat fewer than the round's minimum seats newcomers up to it (its view may lack
  certificates the others hold). Before it
  refuses, or ignores a list whose leader it does not know as established, it reads the
  certificates once more (at most once a second: :data:`REREAD_S`), so a view that lags one store
  behind the leader's does not fail a round.
* **Back-off**: a newcomer seated in a round that failed (one the failure names as missing, when it
  names any: a timeout, a disconnect) is not seated again for :data:`BACKOFF_ROUNDS` rounds, then
  twice as many after each further failure: a staller costs a round now and then, not every round,
  and an honest newcomer of a round that an established member left is not blamed. Each peer keeps
  its own count from the rounds it was in, and only a leader applies it (members' counts differ: a
  member refusing a list over its own count would fail rounds the others see as fine).
* **No early close without the established**: a leader that may close early (``expected_peers``
  joined) waits while an established member of its last group that is still connected has not
  joined, so newcomers that join first cannot take the places of established members.

The rule is active only while some established peer is live (has a live peer record): before a
run's first certified commit, and once every established peer has left, rounds form as before.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from peers.rounds.group import Group
from peers.rounds.round_errors import ListsBannedPeer
from peers.state.certificates import Certified, certified, read_certificates
from swarmtrain.core.errors import SwarmError

__all__ = ["BACKOFF_ROUNDS", "REREAD_S", "Seats", "TooManyNewcomers", "View", "newcomer_seats", "read_view"]

logger = logging.getLogger(__name__)

#: rounds a newcomer seated in a failed round waits before it is seated again (doubles each time)
BACKOFF_ROUNDS = 16
#: seconds between two re-reads of the certificates when a list does not fit this peer's view
REREAD_S = 1.0
_MAX_DOUBLINGS = 16

#: what one read of the run's history gives: its certified states and the live peers (``None``:
#: unknown)
View = tuple[Iterable[Certified], frozenset[str] | None]


class TooManyNewcomers(ListsBannedPeer):
    """A round's published list seats more newcomers than its established members allow, or a
    newcomer this peer still backs off (:class:`Seats`)."""

    def __init__(self, message: str, group: Group) -> None:
        super().__init__(message, group)


def newcomer_seats(n_established: int) -> int:
    """How many newcomers a group with ``n_established`` established members seats: at least one,
    so a newcomer always finds a way in, and fewer than the established members once there are two
    or more, so stallers are never the majority of a group."""
    return max(1, n_established // 2)


def read_view(node: Any, run_id: str, timeout: float) -> View:
    """The run's certified states and live peers, read from the DHT (a failed read: nothing)."""
    certs = read_certificates(node, run_id, timeout)
    if not certs:
        return (), None
    try:
        live: frozenset[str] | None = frozenset(r.peer_id for r in node.live_peers(run_id, timeout=timeout))
    except SwarmError:
        live = None
    return certified(certs, live=live).values(), live


class Seats:
    """The seat rule of one peer (see the module docstring); pure bookkeeping but for ``read``.

    Args:
        read: ``read(timeout)`` returns the run's certified states and live peers (:func:`read_view`
            on a node); ``None``: only what :meth:`note` is given.
        backoff_rounds: rounds of a newcomer's first back-off.
    """

    def __init__(
        self, read: Callable[[float], View] | None = None, backoff_rounds: int = BACKOFF_ROUNDS
    ) -> None:
        self.read = read
        self.backoff_rounds = backoff_rounds
        #: peer -> the smallest certified round it signed that this peer has seen
        self.first: dict[str, int] = {}
        #: the peers with a live record at the last read (``None``: unknown)
        self.live: frozenset[str] | None = None
        #: newcomer -> (failed rounds it was seated in, last round it is barred from)
        self.backoff: dict[str, tuple[int, int]] = {}
        self._read_at = -float("inf")
        #: whether the history was read at least once
        self.was_read = False

    @classmethod
    def for_node(cls, node: Any, run_id: str | None = None) -> Seats:
        """A rule that reads ``node``'s run (or ``run_id``) history from its DHT."""
        run = run_id or node.run_id
        return cls(lambda timeout: read_view(node, run, timeout))

    @classmethod
    def for_admission(cls, node: Any, admission: str) -> Seats | None:
        """The rule for a run with this admission policy: under ``open`` (anyone may join a round)
        :meth:`for_node`; ``None`` under ``allowlist`` and ``token``, where every member is admitted.
        The peer loop's choice."""
        return cls.for_node(node) if admission == "open" else None

    # --- the view -----------------------------------------------------------------------------------

    def note(self, states: Iterable[Certified], live: frozenset[str] | None) -> None:
        """Merge one read: every signer of a certified state is remembered with its first round."""
        for s in states:
            for p in s.signers:
                self.first[p] = min(self.first.get(p, s.round), s.round)
        if live is not None:
            self.live = live

    def refresh(self, timeout: float) -> None:
        """Read the history now (at the start of a round)."""
        if self.read is None:
            return
        self._read_at = time.monotonic()
        self.was_read = True
        try:
            self.note(*self.read(timeout))
        except SwarmError as e:
            logger.info("reading the run's certified history failed: %s", e)

    def recheck(self) -> bool:
        """Read the history again unless it was read in the last :data:`REREAD_S` seconds; whether it
        was read."""
        if self.read is None or time.monotonic() - self._read_at < REREAD_S:
            return False
        self.refresh(2.0)
        return True

    def established(self, round_id: int) -> frozenset[str]:
        """The peers established for round ``round_id``: a certified state of a round before it."""
        return frozenset(p for p, r in self.first.items() if r <= round_id - 1)

    def active(self, round_id: int) -> bool:
        """Whether the rule applies to round ``round_id``: some established peer is live."""
        est = self.established(round_id)
        return bool(est if self.live is None else est & self.live)

    # --- the rule -----------------------------------------------------------------------------------

    def leader(self, joined: Sequence[str], round_id: int) -> str | None:
        """Who leads a round with these joiners: the smallest (rule inactive) or the smallest
        established one (``None``: no established joiner, nobody may lead yet)."""
        if not joined:
            return None
        if not self.active(round_id):
            return min(joined)
        est = self.established(round_id)
        return min((p for p in joined if p in est), default=None)

    def may_lead(self, leader: str, members: Sequence[str], round_id: int) -> bool:
        """Whether a list of ``members`` published by ``leader`` has a valid leader."""
        if leader not in members:
            return False
        if not self.active(round_id):
            return leader == min(members)
        return leader in self.established(round_id)

    def seat(self, joined: Sequence[str], round_id: int, needs: int = 0) -> tuple[str, ...]:
        """A leader's list from its joiners: every established one and up to :func:`newcomer_seats`
        newcomers that are not backing off, in an order that changes every round (a hash of the
        round and the peer ID: no peer ID is seated first every time); sorted. When that seats fewer
        than ``needs`` (the round's minimum), newcomers are seated up to it, those backing off too:
        a round that cannot form without them fails anyway, and this leader's view may lack
        certificates the others hold (a store or read that failed under load)."""
        if not self.active(round_id):
            return tuple(sorted(joined))
        est = self.established(round_id)
        old = [p for p in joined if p in est]
        new = sorted(
            (p for p in joined if p not in est),
            key=lambda p: (
                self.barred(p, round_id),
                hashlib.blake2b(f"{round_id}|{p}".encode(), digest_size=8).digest(),
            ),
        )
        free = sum(not self.barred(p, round_id) for p in new)
        k = max(min(newcomer_seats(len(old)), free), needs - len(old))
        return tuple(sorted(old + new[: max(k, 0)]))

    def breaks(self, members: Sequence[str], round_id: int) -> str | None:
        """Why a published list breaks the rule in this peer's view (``None``: it does not)."""
        if not self.active(round_id):
            return None
        est = self.established(round_id)
        new = [m for m in members if m not in est]
        allowed = newcomer_seats(len(members) - len(new))
        if len(new) > allowed:
            return f"{len(new)} members without history for {allowed} seats"
        return None

    def waiting(self, last_members: Iterable[str], joined: Iterable[str], round_id: int) -> frozenset[str]:
        """The established members of the last group that have not joined (the caller leaves out
        those gone): a leader does not close early while they are missing."""
        if not self.active(round_id):
            return frozenset()
        return (frozenset(last_members) & self.established(round_id)) - frozenset(joined)

    # --- back-off -----------------------------------------------------------------------------------

    def failed(self, members: Sequence[str], round_id: int, missing: Iterable[str] = ()) -> None:
        """Round ``round_id`` with ``members`` failed: its newcomers back off; when the failure names
        the ``missing`` members (a timeout, a disconnect), only the newcomers among them (an honest
        newcomer seated in a round an established member left does not)."""
        if not self.active(round_id):
            return
        est = self.established(round_id)
        suspects = set(missing) & set(members) or set(members)
        for p in members:
            if p not in est and p in suspects:
                n = self.backoff.get(p, (0, 0))[0] + 1
                until = round_id + self.backoff_rounds * 2 ** min(n - 1, _MAX_DOUBLINGS)
                self.backoff[p] = (n, until)
                logger.info(
                    "newcomer %s seated in failed round %d: not seated up to round %d",
                    p[:12],
                    round_id,
                    until,
                )

    def barred(self, peer: str, round_id: int) -> bool:
        """Whether ``peer`` is still backing off in round ``round_id``."""
        return peer in self.backoff and round_id <= self.backoff[peer][1]
