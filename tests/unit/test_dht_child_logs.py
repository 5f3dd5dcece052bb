"""The DHT process's log filter: a pipe error after the peer process died is not shown, any other
error (or one while the peer lives) is."""

from __future__ import annotations

import logging
import os

from peers.node import _NoOrphanPipeErrors


def _record(exc: BaseException | None) -> logging.LogRecord:
    info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("hivemind.dht.dht", logging.ERROR, __file__, 1, "x", None, info)


def test_pipe_errors_are_dropped_only_once_the_parent_is_gone() -> None:
    alive = _NoOrphanPipeErrors(os.getppid())  # our parent lives: everything shows
    gone = _NoOrphanPipeErrors(os.getppid() + 1)  # "another" parent: the one we had died
    reset = ConnectionResetError(104, "Connection reset by peer")
    assert alive.filter(_record(reset))
    assert not gone.filter(_record(reset))
    assert not gone.filter(_record(EOFError()))
    assert gone.filter(_record(ValueError("a real bug")))
    assert gone.filter(_record(None))
