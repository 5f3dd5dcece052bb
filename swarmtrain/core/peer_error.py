"""A peer's error as the process that started it reports it: one line, and the peer's own traceback.

A peer process (a simulated peer, a SWARM server or trainer, the bootstrap node) never sends its
exception object to its parent: its queue carries plain data only (a peer's objects are never
unpickled), and many exceptions do not survive a pickle anyway. It sends two plain strings instead,
:func:`report_error`: the traceback text (``("traceback", rank, text)``), then the one line it always
sent (``("error", rank, "peer 1: ValueError: ...")``). A reader that knows only ``"error"`` skips the
first message and reads the second, the one line. The parent keeps the traceback until the line comes
(:class:`ErrorReports`) and raises :class:`PeerError`, which carries both.

The CLI prints the line (``swarmtrain: error: ...``); with ``-v`` the traceback first
(:func:`error_traceback`): the peer's own for a :class:`PeerError`, never the parent's re-raise, and
for any other ``SwarmError`` its traceback in this process (``swarmtrain join`` runs its peer here).
"""

from __future__ import annotations

import traceback
from typing import Any

from swarmtrain.core.errors import SwarmError

__all__ = ["TRACEBACK", "PeerError", "ErrorReports", "error_line", "report_error", "error_traceback"]

#: the kind of the queue message that carries a peer's traceback text, just before its ``"error"``
TRACEBACK = "traceback"

#: characters of a traceback sent over a queue; a longer one keeps its start and its end
MAX_TRACEBACK = 20_000


class PeerError(SwarmError):
    """A peer process reported an error. ``str()`` is its one line; ``peer_traceback`` the traceback
    text from the peer's own process (``None`` when it sent none, e.g. it stopped on a signal)."""

    def __init__(self, line: str, peer_traceback: str | None = None) -> None:
        super().__init__(line)
        self.peer_traceback = peer_traceback


def error_line(who: str, exc: BaseException) -> str:
    """``"<who>: <ExceptionType>: <message>"``: the line a peer's parent prints by default."""
    return f"{who}: {type(exc).__name__}: {exc}"


def _clip(text: str) -> str:
    if len(text) <= MAX_TRACEBACK:
        return text
    half = MAX_TRACEBACK // 2
    return f"{text[:half]}\n... ({len(text) - 2 * half} characters left out) ...\n{text[-half:]}"


def report_error(q: Any, rank: int, who: str, exc: BaseException) -> None:
    """In a peer process: send ``exc``'s traceback text, then its one line (:func:`error_line`)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    q.put((TRACEBACK, rank, _clip(text)))
    q.put(("error", rank, error_line(who, exc)))


class ErrorReports:
    """The parent's side: each sender's traceback text, kept until its error line arrives."""

    def __init__(self) -> None:
        self._texts: dict[int, str] = {}

    def note(self, rank: int, text: Any) -> None:
        """A ``("traceback", rank, text)`` message arrived."""
        self._texts[rank] = str(text)

    def forget(self, rank: int) -> None:
        """``rank``'s process was started again, or its error is ignored: drop what it sent."""
        self._texts.pop(rank, None)

    def error(self, rank: int, line: Any) -> PeerError:
        """The error to raise for ``("error", rank, line)``, with ``rank``'s traceback if it sent one."""
        return PeerError(str(line), self._texts.pop(rank, None))


def error_traceback(exc: BaseException) -> str:
    """What ``-v`` prints above an error's line: a peer's own traceback for a :class:`PeerError`
    (empty when it sent none), else ``exc``'s traceback in this process."""
    if isinstance(exc, PeerError):
        return exc.peer_traceback or ""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
