"""Third-party noise (``swarmtrain.app.logs``): hidden by default, shown with ``-v``."""

from __future__ import annotations

import logging

import pytest

from swarmtrain.app.logs import quiet_third_party


def _daemon_record(level: int) -> logging.LogRecord:
    rec = logging.LogRecord(
        "hivemind.p2p.p2p_daemon", level, __file__, 1, "use of closed network connection", None, None
    )
    rec.caller = "p2pd"  # how hivemind marks the daemon's relayed lines
    return rec


def test_the_daemon_lines_and_hivemind_info_are_hidden_unless_verbose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HIVEMIND_LOGLEVEL", raising=False)
    daemon = logging.getLogger("hivemind.p2p.p2p_daemon")
    hm = logging.getLogger("hivemind")
    old = hm.level
    try:
        quiet_third_party(False)
        import os

        assert os.environ["HIVEMIND_LOGLEVEL"] == "ERROR"  # child processes and a later import see it
        assert hm.getEffectiveLevel() == logging.ERROR
        assert not daemon.filter(_daemon_record(logging.ERROR))
        own = logging.LogRecord(daemon.name, logging.ERROR, __file__, 1, "handler failed", None, None)
        assert daemon.filter(own)  # hivemind's own errors still pass
        quiet_third_party(True)
        assert daemon.filter(_daemon_record(logging.ERROR))
    finally:
        hm.setLevel(old)
        quiet_third_party(True)


def test_a_level_the_user_chose_is_kept_and_nothing_is_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HIVEMIND_LOGLEVEL", "DEBUG")
    hm = logging.getLogger("hivemind")
    old = hm.level
    try:
        quiet_third_party(False)
        import os

        assert os.environ["HIVEMIND_LOGLEVEL"] == "DEBUG"
        assert logging.getLogger("hivemind.p2p.p2p_daemon").filter(_daemon_record(logging.ERROR))
    finally:
        hm.setLevel(old)
        quiet_third_party(True)


_LEAK = """
import logging, multiprocessing as mp, sys
from multiprocessing import resource_tracker
logging.basicConfig(level=logging.DEBUG if sys.argv[1] == "verbose" else logging.WARNING)
from swarmtrain.simulation.runner import quiet_resource_tracker
quiet_resource_tracker()
q = mp.get_context("spawn").Queue()  # starts the tracker, as run_simulation does
resource_tracker.register("/swarmtrain-test-leak", "semaphore")  # what a killed peer leaves
"""


@pytest.mark.parametrize("mode", ["quiet", "verbose"])
def test_the_resource_trackers_leaked_semaphore_line_is_hidden_unless_verbose(mode: str) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        ["bash", "-c", f'"{sys.executable}" -c "$0" {mode}; sleep 1', _LEAK],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ("leaked semaphore" in out.stderr) == (mode == "verbose"), out.stderr[-2000:]


def test_a_stream_for_a_removed_handler_is_not_a_traceback_unless_verbose() -> None:
    """A peer still sending to one that is leaving: hivemind raises DispatchFailure inside asyncio's
    client_connected_cb, which asyncio logs with a traceback above the peer's last line (the give-up
    test saw it in a full-suite run). Other asyncio errors still show."""
    from hivemind.p2p.p2p_daemon_bindings.utils import DispatchFailure

    def record(exc: BaseException) -> logging.LogRecord:
        msg = "Unhandled exception in client_connected_cb"
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, (type(exc), exc, None))

    aio = logging.getLogger("asyncio")
    try:
        quiet_third_party(False)
        assert not aio.filter(record(DispatchFailure("swarmtrain.run.collective")))
        assert aio.filter(record(RuntimeError("something else")))
        quiet_third_party(True)
        assert aio.filter(record(DispatchFailure("swarmtrain.run.collective")))
    finally:
        quiet_third_party(True)


def test_a_daemon_exit_seen_after_its_loop_closed_is_not_a_line_unless_verbose() -> None:
    """A join refused at the manifest fetch (a peer ID that does not answer): the throwaway client's
    daemon exits after its loop stopped, and asyncio's child watcher said so after the one line the
    refusal prints (a quick-loop run saw it). Other asyncio warnings still show."""
    msg = "Loop %r that handles pid %r is closed"

    def record(text: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.WARNING, __file__, 1, text, ("<loop>", 1234), None)

    aio = logging.getLogger("asyncio")
    try:
        quiet_third_party(False)
        assert not aio.filter(record(msg))
        assert aio.filter(record("Unknown child process pid %d, will report returncode 255"))
        quiet_third_party(True)
        assert aio.filter(record(msg))
    finally:
        quiet_third_party(True)
