"""``peers.dht.process.GracefulExit``: a stop signal the kernel hands to another thread than the main
one still ends the main thread's wait at once (a lingering peer ignored the runner's SIGTERM for 15 s)."""

from __future__ import annotations

import signal
import threading
import time

from peers.dht.process import SIGNAL_POLL_S, GracefulExit


def _signal_from_another_thread(delay: float) -> threading.Thread:
    def send() -> None:
        time.sleep(delay)
        # thread-directed: the C-level handler runs in this thread, as when the kernel picks it
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        time.sleep(0.5)  # stay alive while the signal is delivered

    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


def test_a_signal_delivered_to_another_thread_ends_the_wait_promptly() -> None:
    with GracefulExit(message="test") as stop:
        t = _signal_from_another_thread(0.3)
        t0 = time.monotonic()
        assert stop.wait(30.0)
        waited = time.monotonic() - t0
        t.join()
    assert stop.signum == signal.SIGTERM
    # one long lock wait would have returned only at its 30 s timeout; slices end it within
    # SIGNAL_POLL_S of the signal (the bound is loose for a loaded machine)
    assert waited < 15.0 and SIGNAL_POLL_S < 1.0, waited


def test_wait_without_a_signal_times_out_and_says_so() -> None:
    with GracefulExit(message="test") as stop:
        t0 = time.monotonic()
        assert not stop.wait(0.5)
        assert time.monotonic() - t0 >= 0.5
        assert not stop.wait(0)
