"""The DHT process's command pipe: broken because the peer process died, it ends the DHT process
quietly; broken while the peer lives, it raises as before."""

from __future__ import annotations

import os

import pytest

from peers.dht.node import _exit_when_orphaned


class _Died(Exception):
    pass


def _die() -> None:
    raise _Died


def _broken(exc: BaseException):  # type: ignore[no-untyped-def]
    def recv() -> None:
        raise exc

    return recv


def test_a_pipe_broken_by_the_parents_death_ends_the_process() -> None:
    gone = os.getppid() + 1  # "our parent was another process": the one we had died
    for exc in (ConnectionResetError(104, "Connection reset by peer"), EOFError()):
        with pytest.raises(_Died):
            _exit_when_orphaned(_broken(exc), gone, _die)()


def test_a_pipe_error_while_the_parent_lives_still_raises() -> None:
    alive = os.getppid()
    with pytest.raises(EOFError):
        _exit_when_orphaned(_broken(EOFError()), alive, _die, grace=0.1)()
    with pytest.raises(ValueError):  # not a pipe error: never swallowed
        _exit_when_orphaned(_broken(ValueError("bug")), alive + 1, _die)()
    assert _exit_when_orphaned(lambda: ("m", (), {}), alive + 1, _die)() == ("m", (), {})
