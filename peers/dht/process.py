"""Process lifecycles of peers: own process groups, group kills, orphan finding, graceful signals.

hivemind runs its DHT in a forked child and the Go ``p2pd`` daemon as a grandchild; both survive a
SIGKILL of the peer's main process (docs/architecture.md, Known traps). So every peer process started
here runs in its own session (``setsid``: process group ID = its PID), and :func:`kill_group` signals
the whole group (SIGTERM, then SIGKILL after a grace period), which reaches the helpers too. Peers
started here also carry a marker in their environment (inherited by the DHT child and ``p2pd``), so
:func:`find_orphans` can tell our leftovers from anything else on the machine.

No process outlives its parent: a process started by :func:`spawn_function` runs
:func:`die_with_parent`, a watchdog thread that SIGKILLs its whole process group (the peer, its DHT
child and ``p2pd``) within a fraction of a second of its parent's death, whatever killed the parent.
A parent-death signal (``prctl(PR_SET_PDEATHSIG)``) would reach the main process only, and only when
the thread that forked it dies; the group kill reaches the helpers too, even before they are up.

Peer processes are forked by a multiprocessing fork server (:func:`process_context`) that imported
torch once: a fresh interpreter per peer spent 2-5 s of CPU importing it and the rest, which a
many-peer run on a few cores pays at every start and restart. The fork server is a child of the
caller; it exits once the caller and every process it forked are gone. A forked peer gets the
caller's environment and working directory as a spawned one would, and its watchdog watches the
caller as well as its real parent, the fork server. ``cold=True`` starts a fresh interpreter
instead (``spawn``): the simulations restart peers that way, as a restarted volunteer's process
imports everything again.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Any

__all__ = [
    "MARKER_ENV",
    "PeerProcess",
    "spawn_function",
    "spawn_command",
    "kill_group",
    "find_orphans",
    "become_group_leader",
    "die_with_parent",
    "process_context",
    "GracefulExit",
]

logger = logging.getLogger(__name__)
MARKER_ENV = "SWARMTRAIN_PEER_MARKER"


def become_group_leader() -> None:
    """Make the calling process the leader of a new session and process group (idempotent)."""
    if os.getpgrp() != os.getpid():
        try:
            os.setsid()
        except PermissionError:  # already a session leader
            pass


#: seconds between two looks at the parent in :func:`die_with_parent`
PARENT_POLL_S = 0.25

#: the longest slice :meth:`GracefulExit.wait` blocks for before the main thread runs its signal
#: handlers (a signal the kernel handed to another thread does not wake a blocked main thread)
SIGNAL_POLL_S = 0.2

#: what the fork server of :func:`process_context` imports once for every process it forks: torch
#: and ``torch._dynamo``, then frozen for the collector (:mod:`peers.dht.preload`). Not hivemind: it
#: makes process-shared locks at import (``hivemind.utils.mpfuture``), which every forked peer would
#: then share, and a peer killed while holding one stops every later peer's DHT from starting (it
#: hung the chaos tests).
FORK_SERVER_PRELOAD = ("peers.dht.preload",)


def process_context(cold: bool = False) -> Any:
    """The multiprocessing context that peer processes (and the queues they report on) use: a fork
    server that imported :data:`FORK_SERVER_PRELOAD` and did nothing else (no Python thread, CUDA
    context, event loop or process-shared lock exists in it; the idle native pool that torch starts
    at import is the fork-safe one every DataLoader worker relies on). It starts with the first process and
    serves this interpreter's later ones. ``cold``: ``spawn`` instead, a fresh interpreter per process."""
    if cold:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(FORK_SERVER_PRELOAD))
    return ctx


def _watch_caller(pid: int) -> Callable[[], bool]:
    """A check that process ``pid`` still runs (not ended, not a zombie its parent has yet to reap,
    not another process that took its ID)."""
    import psutil

    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return lambda: False

    def alive() -> bool:
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    return alive


def die_with_parent(parent_pid: int | None = None, *, poll: float = PARENT_POLL_S) -> threading.Thread:
    """Tie this process to its parent: a daemon thread checks every ``poll`` seconds whether the parent
    is gone (this process was re-parented, or ``parent_pid``, the process that asked for this one
    through a fork server, no longer exists) and then SIGKILLs this process's group when this process
    leads it (its DHT child and ``p2pd`` with it), else this process alone. Returns the thread
    (already started).

    A SIGKILL, not a graceful stop: a parent that died can no longer collect anything, and a graceful
    stop of a training peer may take longer than the few seconds an orphan may live.
    """
    parent = os.getppid()
    caller = (lambda: True) if parent_pid is None else _watch_caller(parent_pid)

    def _orphaned() -> None:
        logger.debug("parent %d (%s) is gone: killing process group %d", parent, parent_pid, os.getpgrp())
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    def _watch() -> None:
        while True:
            if os.getppid() != parent or not caller():
                _orphaned()
            time.sleep(poll)

    t = threading.Thread(target=_watch, name="swarmtrain-parent-watch", daemon=True)
    t.start()
    return t


def _group_members(pgid: int) -> list[int]:
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return out


def kill_group(pgid: int, grace: float = 5.0) -> bool:
    """SIGTERM the process group ``pgid``; SIGKILL what is left after ``grace`` seconds.

    Never signals our own process group. Returns True when no member of the group is left.
    """
    if pgid <= 1 or pgid == os.getpgrp():
        raise ValueError(f"refusing to kill process group {pgid}")
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if not _group_members(pgid):
            return True
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        if not _group_members(pgid):
            return True
        time.sleep(0.1)
    return not _group_members(pgid)


def find_orphans(marker: str | None = None, pgids: Iterable[int] = ()) -> list[Any]:
    """Live processes that belong to peers we started: those whose environment holds ``marker``
    under :data:`MARKER_ENV` (any marker if ``None``) or whose process group is in ``pgids``.

    Returns ``psutil.Process`` objects (excluding this process).
    """
    import psutil

    groups = set(pgids)
    out = []
    me = os.getpid()
    for p in psutil.process_iter(["pid", "status"]):
        if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if groups and os.getpgid(p.pid) in groups:
                out.append(p)
                continue
            env = p.environ()
        except (psutil.Error, ProcessLookupError, OSError):
            continue
        value = env.get(MARKER_ENV)
        if value is not None and (marker is None or value == marker):
            out.append(p)
    return out


class PeerProcess:
    """A peer process leading its own process group.

    Attributes:
        pid: its PID (also its process group ID once it has called ``setsid``).
        marker: the value of :data:`MARKER_ENV` in its environment.
    """

    def __init__(self, pid: int, marker: str, handle: Any) -> None:
        self.pid = pid
        self.marker = marker
        self._handle = handle

    @property
    def alive(self) -> bool:
        """Whether the main process still runs."""
        if isinstance(self._handle, subprocess.Popen):
            return self._handle.poll() is None
        return bool(self._handle.is_alive())

    @property
    def exitcode(self) -> int | None:
        """Exit status (negative: killed by that signal), ``None`` while running."""
        if isinstance(self._handle, subprocess.Popen):
            return self._handle.poll()
        return self._handle.exitcode  # type: ignore[no-any-return]

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the main process only (e.g. SIGKILL to simulate a crash)."""
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def join(self, timeout: float) -> bool:
        """Wait for the main process to exit; True if it did."""
        if isinstance(self._handle, subprocess.Popen):
            try:
                self._handle.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        self._handle.join(timeout)
        return not self._handle.is_alive()

    def terminate(self, grace: float = 5.0) -> bool:
        """SIGTERM the whole group, SIGKILL after ``grace``; reap; True when nothing of it is left."""
        ok = True
        if self.pid != os.getpgrp():
            try:
                if os.getpgid(self.pid) == self.pid:
                    ok = kill_group(self.pid, grace)
                else:  # it has not called setsid yet: signal it alone
                    self.signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            ok = kill_group(self.pid, 0.5) if _group_members(self.pid) else ok
        self.join(5.0)
        leftovers = find_orphans(self.marker)
        for p in leftovers:  # e.g. a helper that left the group: kill it by PID
            try:
                p.kill()
            except Exception:
                pass
        return ok and not find_orphans(self.marker)


def _function_entry(
    marker: str,
    target: Callable[..., Any],
    args: tuple[Any, ...],
    parent_pid: int,
    env: dict[str, str],
    cwd: str,
) -> None:
    become_group_leader()
    die_with_parent(parent_pid)
    os.environ.clear()  # the caller's, as a spawned process would have them (not the fork server's)
    os.environ.update(env)
    os.environ[MARKER_ENV] = marker
    os.chdir(cwd)
    target(*args)


def spawn_function(
    target: Callable[..., Any], args: Sequence[Any] = (), *, name: str = "peer", cold: bool = False
) -> PeerProcess:
    """Run ``target(*args)`` in a new process (forked by :func:`process_context`'s fork server) in its
    own session, with this process's environment and working directory. ``cold``: a fresh
    interpreter instead (``spawn``), which imports everything again as a restarted volunteer's new
    process does (the simulations' restarts).

    ``target`` must be importable (module-level). Pass a ``multiprocessing`` queue in ``args`` (from
    :func:`process_context` with the same ``cold``) to report addresses back; bind to port 0 and
    report the real maddrs. The process and its helpers die with this process
    (:func:`die_with_parent`).
    """
    marker = uuid.uuid4().hex
    ctx = process_context(cold)
    entry_args = (marker, target, tuple(args), os.getpid(), dict(os.environ), os.getcwd())
    proc = ctx.Process(target=_function_entry, args=entry_args, name=name, daemon=False)
    proc.start()
    if proc.pid is None:  # pragma: no cover
        raise RuntimeError("process did not start")
    return PeerProcess(proc.pid, marker, proc)


def spawn_command(argv: Sequence[str], *, env: dict[str, str] | None = None, **popen: Any) -> PeerProcess:
    """Start ``argv`` as a subprocess in a new session (``start_new_session=True``) with a marker."""
    marker = uuid.uuid4().hex
    full_env = dict(os.environ if env is None else env)
    full_env[MARKER_ENV] = marker
    proc = subprocess.Popen(list(argv), env=full_env, start_new_session=True, **popen)
    return PeerProcess(proc.pid, marker, proc)


class GracefulExit:
    """SIGTERM/SIGINT handling for a peer's main loop: the first signal asks to stop, the second forces.

    Usage::

        with GracefulExit() as stop, PeerNode(cfg) as node:
            while not stop.requested:
                train_one_step()
        # leaving the ``with`` shuts the node down and deregisters it

    The first signal sets :attr:`requested` (and calls ``on_signal`` if given) so the loop finishes or
    abandons its round and exits through the ``with`` blocks; a second signal raises
    ``KeyboardInterrupt``. Handlers can only be installed from the main thread; elsewhere this is a
    no-op flag. ``message`` is what the first signal logs.
    """

    def __init__(
        self,
        on_signal: Callable[[int], None] | None = None,
        signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT),
        message: str = "finishing the current round and leaving",
    ) -> None:
        self._message = message
        self._event = threading.Event()
        self._on_signal = on_signal
        self._signals = tuple(signals)
        self._previous: dict[int, Any] = {}
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        """True once a stop signal arrived."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a stop signal arrives (or ``timeout``); True if one did.

        Waits in short slices: the kernel hands a process's signal to any of its threads, and when
        it is not the main thread, a main thread blocked on one long lock wait is not woken, so the
        handler (which runs in the main thread) would only run when that wait ends (a peer that
        lingers 15 s after SIGTERM, a DHT node killed after its grace). Between slices the main
        thread runs its pending handlers."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self._event.is_set():
            left = SIGNAL_POLL_S if end is None else min(SIGNAL_POLL_S, end - time.monotonic())
            if left <= 0:
                break
            self._event.wait(left)
        return self._event.is_set()

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self._event.is_set():
            raise KeyboardInterrupt
        self.signum = signum
        self._event.set()
        logger.warning("received signal %d: %s", signum, self._message)
        if self._on_signal is not None:
            self._on_signal(signum)

    def __enter__(self) -> GracefulExit:
        if threading.current_thread() is threading.main_thread():
            for s in self._signals:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, prev in self._previous.items():
            signal.signal(s, prev)
        self._previous.clear()
