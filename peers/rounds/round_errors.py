"""Why a collective round failed, as exception types.

Every failure of a round is a :class:`RoundFailed`; its subclass says the kind, so callers decide by
type (``isinstance``), never by message text. The message is what ``RoundResult.reason`` reports.

Two kinds are *quiet* (:data:`QUIET`): when this peer fails with one, every other member learns of
the failure on its own (a member that aborted already told everyone; an owner-check mismatch is seen
by every member), so this peer does not send aborts of its own.
"""

from __future__ import annotations

from peers.rounds.group import Group
from swarmtrain.core.errors import SwarmError

__all__ = [
    "RoundFailed",
    "RoundLate",
    "RoundTimeout",
    "ListsBannedPeer",
    "MemberAborted",
    "MemberGone",
    "SendFailed",
    "WrongGroup",
    "OwnerCheckFailed",
    "QUIET",
]


class RoundFailed(SwarmError):
    """The round could not be formed or finished; the message says why (returned in ``RoundResult``).

    Attributes:
        missing: the members whose messages this peer still waited for (full peer IDs), when the
            failure says (a timeout or a disconnected member); empty when it does not.
    """

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


class RoundLate(RoundFailed):
    """The round formed without this peer (it arrived after the list was fixed): the others go on
    and commit it, so this peer's state is one outer step behind until it catches up."""


class RoundTimeout(RoundFailed):
    """The round's deadline passed before the messages this peer waited for arrived (or before a group
    formed)."""


class ListsBannedPeer(RoundFailed):
    """The round's published list holds a peer this peer considers banned; ``group`` is that list
    (so the caller can tell its members to abort rather than wait for it)."""

    def __init__(self, message: str, group: Group) -> None:
        super().__init__(message)
        self.group = group


class MemberAborted(RoundFailed):
    """Another member of the round told this peer it aborted the round."""


class MemberGone(RoundFailed):
    """A member this peer still waits for no longer has a connection to it."""


class SendFailed(RoundFailed):
    """A message this peer sent for the round was refused or not acknowledged in time."""


class WrongGroup(RoundFailed):
    """A message for this round carries the digest of another member list or tensor layout."""


class OwnerCheckFailed(RoundFailed):
    """A primary's aggregate bytes differ from its verifier's digest; the round commits for nobody.

    Attributes:
        pairs: ``(primary, verifier)`` peer IDs of every partition that failed the check.
    """

    def __init__(self, message: str, pairs: list[tuple[str, str]]) -> None:
        super().__init__(message)
        self.pairs = pairs


#: failures every other member learns of without an abort from this peer
QUIET: tuple[type[RoundFailed], ...] = (MemberAborted, OwnerCheckFailed)
