"""The fixed membership of one collective round and the digest that binds messages to it.

A round's group is one leader's published member list (``peers.rounds.rounds``); every message of the round
carries the group digest, so a peer holding another list refuses the message rather than mixing
members.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["Group", "group_digest"]


@dataclass(frozen=True)
class Group:
    """The fixed membership of one round.

    Attributes:
        kind: the collective kind (``"reduce"``, ``"gather"``...).
        round_id: the round number.
        members: sorted peer IDs; partition ``i`` belongs to ``members[i]``.
        leader: the peer that fixed the list (``min(members)``, or under the seat rule of
            ``peers.rounds.seats`` an established member: the smallest established joiner it saw).
        digest: 16-byte hash of (run, kind, round, members); every message of the round carries it.
        index: this peer's position in ``members``.
    """

    kind: str
    round_id: int
    members: tuple[str, ...]
    leader: str
    digest: bytes
    index: int

    @property
    def size(self) -> int:
        """Number of members."""
        return len(self.members)


def group_digest(run_id: str, kind: str, round_id: int, members: tuple[str, ...]) -> bytes:
    """The 16-byte digest that binds a message to one round and one member list."""
    h = hashlib.sha256(f"{run_id}|{kind}|{round_id}|".encode())
    h.update(",".join(members).encode())
    return h.digest()[:16]
