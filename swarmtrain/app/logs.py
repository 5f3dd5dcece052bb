"""Third-party log noise, hidden unless ``-v``.

hivemind logs at INFO by default through its own handler (``HIVEMIND_LOGLEVEL``), which prints, for
example, an identity check on every start; and it relays its p2p daemon's Go log lines at their own
level, so a shutdown prints ``[ERROR] ... use of closed network connection`` although nothing went
wrong. Neither is anything a volunteer can act on: what fails in a run reaches them as this project's
own warnings and errors. With ``-v`` everything is shown.
"""

from __future__ import annotations

import logging
import os

__all__ = ["quiet_third_party"]


class _NoDaemonLines(logging.Filter):
    """Drops the p2p daemon's relayed log lines (hivemind marks them with a ``caller`` attribute)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not hasattr(record, "caller")


class _NoRemovedHandlerStreams(logging.Filter):
    """Drops asyncio's "Unhandled exception in client_connected_cb" for a stream that arrived for a
    handler this peer has already removed (hivemind raises ``DispatchFailure``): a peer still
    sending to one that is leaving. Nothing went wrong here, and the traceback buried the one line
    saying why the peer stopped. Drops :data:`_CLOSED_LOOP` too."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return type(exc).__name__ != "DispatchFailure" and record.msg != _CLOSED_LOOP


#: asyncio's child watcher, when a p2p daemon exits after the event loop that started it was closed
#: (a client whose start failed: its daemon is killed, and the loop stops before the exit is seen).
#: The exit needs no handling there; the line came after the one saying why ``join`` stopped.
_CLOSED_LOOP = "Loop %r that handles pid %r is closed"


_FILTER = _NoDaemonLines()
_STREAMS = _NoRemovedHandlerStreams()


def quiet_third_party(verbose: bool) -> None:
    """Hide hivemind's INFO/WARNING lines and the p2p daemon's relayed lines unless ``verbose``.

    Sets ``HIVEMIND_LOGLEVEL`` (read by hivemind when first imported, here and in child processes)
    and filters the daemon's lines in this process; a ``HIVEMIND_LOGLEVEL`` the user set is left
    alone, with everything shown.
    """
    daemon = logging.getLogger("hivemind.p2p.p2p_daemon")
    if verbose:
        daemon.removeFilter(_FILTER)
        logging.getLogger("asyncio").removeFilter(_STREAMS)
        return
    logging.getLogger("asyncio").addFilter(_STREAMS)  # whatever HIVEMIND_LOGLEVEL says
    if "HIVEMIND_LOGLEVEL" in os.environ:  # the user's choice stands
        return
    os.environ["HIVEMIND_LOGLEVEL"] = "ERROR"
    logging.getLogger("hivemind").setLevel(logging.ERROR)
    daemon.addFilter(_FILTER)
