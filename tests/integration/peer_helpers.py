"""Spawn/teardown helpers for integration tests with real peers on 127.0.0.1 (reusable by any test).

Each peer is a fresh interpreter (multiprocessing ``spawn``) that becomes the leader of its own session
and process group, so hivemind's DHT child and ``p2pd`` die with the group. Peer 0 starts first and
is the bootstrap node: the others get its multiaddrs as ``initial_peers``. Peers report through one
queue as tuples ``(tag, rank, payload)``: ``report(q, "ready", rank, {...})`` once their node is up,
then whatever the test wants (``"result"``...). Teardown (always, in ``finally``): SIGTERM each group,
SIGKILL after a grace period, then check that no process carrying a peer's marker is left.

Usage::

    def worker(rank, initial_peers, q, *args):       # module-level, importable
        with PeerNode(loopback_config("run", initial_peers)) as node:
            report(q, "ready", rank, {"peer_id": node.peer_id, "maddrs": node.visible_maddrs})
            ...
            report(q, "result", rank, {...})

    with PeerGroup(worker, n=3, args=(...,)) as g:
        results = g.collect("result", timeout=60)     # {rank: payload}
    assert g.orphans == []
"""

from __future__ import annotations

import contextlib
import os
import queue as queue_mod
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from peers.dht.process import PeerProcess, find_orphans, process_context, spawn_command, spawn_function
from swarmtrain.core.config import PeersConfig
from swarmtrain.core.packet import Packet

__all__ = [
    "LOOPBACK",
    "PeerGroup",
    "report",
    "reporting_errors",
    "loopback_config",
    "Fp32Identity",
    "tensor_bytes",
    "tensor_from_bytes",
    "SWARMTRAIN",
    "LOOP",
    "cli_env",
    "start_cli_dht",
    "spawn_join",
    "wait_exit",
]

LOOPBACK = "/ip4/127.0.0.1/tcp/0"


def loopback_config(run_id: str, initial_peers: Sequence[str] = (), **kw: Any) -> PeersConfig:
    """A ``PeersConfig`` listening on 127.0.0.1 with an OS-chosen port."""
    return PeersConfig(run_id=run_id, initial_peers=list(initial_peers), host_maddrs=[LOOPBACK], **kw)


def report(q: Any, tag: str, rank: int, payload: Any = None) -> None:
    """Send ``(tag, rank, payload)`` to the test process."""
    q.put((tag, rank, payload))


@contextlib.contextmanager
def reporting_errors(q: Any, rank: int) -> Iterator[None]:
    """In a worker: turn an exception into an ``("error", rank, traceback)`` report, then re-raise."""
    try:
        yield
    except BaseException:
        report(q, "error", rank, traceback.format_exc()[-4000:])
        raise


def tensor_bytes(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    """A picklable exact copy of a tensor for the result queue (dtype name, shape, raw bytes)."""
    t = t.detach().contiguous().cpu()
    return str(t.dtype).removeprefix("torch."), tuple(t.shape), t.view(torch.uint8).numpy().tobytes()


def tensor_from_bytes(x: tuple[str, tuple[int, ...], bytes]) -> torch.Tensor:
    """Inverse of :func:`tensor_bytes`."""
    dtype, shape, raw = x
    return torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape).clone()


class Fp32Identity:
    """A tiny lossless codec for tests that must not depend on ``compression`` (codec name ``none``)."""

    name = "none"

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        t = t.detach().to(torch.float32).contiguous()
        return Packet("none", tuple(t.shape), "float32", (t.numpy().tobytes(),))

    def decompress(self, p: Packet) -> torch.Tensor:
        raw = p.buffers[0]
        if len(raw) != 4 * p.numel:
            raise ValueError("wrong buffer size")
        return torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(p.shape)


class PeerGroup:
    """``n`` peer processes running ``target(rank, initial_peers, q, *args)``; a context manager.

    Args:
        target: module-level worker function.
        n: number of peers; rank 0 starts first and bootstraps the others.
        args: extra arguments for every worker.
        initial_peers: if given, every peer (rank 0 too) bootstraps from these instead.
        startup_timeout: seconds to wait for each ``"ready"`` report.
    """

    def __init__(
        self,
        target: Callable[..., Any],
        n: int,
        *,
        args: Sequence[Any] = (),
        initial_peers: Sequence[str] | None = None,
        startup_timeout: float = 90.0,
    ) -> None:
        self.target = target
        self.n = n
        self.args = tuple(args)
        self.initial_peers = list(initial_peers) if initial_peers is not None else None
        self.startup_timeout = startup_timeout
        self.q: Any = process_context().Queue()
        self.procs: list[PeerProcess] = []
        self.ready: dict[int, Any] = {}
        self.orphans: list[str] = []
        self._pending: list[tuple[str, int, Any]] = []

    # --- lifecycle ------------------------------------------------------------------------------------

    def __enter__(self) -> PeerGroup:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def spawn(
        self, rank: int, initial_peers: Sequence[str], args: Sequence[Any] | None = None
    ) -> PeerProcess:
        """Start one more peer process (e.g. a newcomer mid-test)."""
        a = self.args if args is None else tuple(args)
        proc = spawn_function(self.target, (rank, list(initial_peers), self.q, *a), name=f"peer{rank}")
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        """Spawn rank 0, wait for its maddrs, then the others; wait until all are ready."""
        if self.initial_peers is None:
            self.spawn(0, [])
            first = self.wait_for("ready", 0, self.startup_timeout)
            boot = list(first["maddrs"])
            self.ready[0] = first
            rest = range(1, self.n)
        else:
            boot = self.initial_peers
            rest = range(self.n)
        self.bootstrap_maddrs = boot
        for r in rest:
            self.spawn(r, boot)
        for r in rest:
            self.ready[r] = self.wait_for("ready", r, self.startup_timeout)

    def stop(self) -> None:
        """Terminate every group (SIGTERM, then SIGKILL), reap, and record leftover processes."""
        for p in self.procs:
            p.terminate(grace=5.0)
        left = []
        for p in self.procs:
            left += [f"{o.pid}:{' '.join(o.cmdline()[:2])}" for o in find_orphans(p.marker) if o.is_running()]
        self.orphans = left
        try:
            self.q.close()
        except Exception:
            pass

    # --- messages -------------------------------------------------------------------------------------

    def _next(self, deadline: float) -> tuple[str, int, Any]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no report from the peers in time")
            try:
                return self.q.get(timeout=min(left, 1.0))  # type: ignore[no-any-return]
            except queue_mod.Empty:
                dead = [i for i, p in enumerate(self.procs) if not p.alive and p.exitcode not in (0, None)]
                if dead and all(not p.alive for p in self.procs):
                    codes = [p.exitcode for p in self.procs]
                    raise RuntimeError(f"all peers exited; exit codes {codes}") from None

    def wait_for(self, tag: str, rank: int, timeout: float) -> Any:
        """The payload of the next ``(tag, rank)`` report (others are kept for later)."""
        for i, (t, r, payload) in enumerate(self._pending):
            if t == tag and r == rank:
                del self._pending[i]
                return payload
        deadline = time.monotonic() + timeout
        while True:
            t, r, payload = self._next(deadline)
            if t == "error":
                raise RuntimeError(f"peer {r} failed: {payload}")
            if t == tag and r == rank:
                return payload
            self._pending.append((t, r, payload))

    def collect(self, tag: str, timeout: float, ranks: Sequence[int] | None = None) -> dict[int, Any]:
        """``{rank: payload}`` of one ``tag`` report from each of ``ranks`` (default: all)."""
        deadline = time.monotonic() + timeout
        want = list(range(self.n)) if ranks is None else list(ranks)
        return {r: self.wait_for(tag, r, max(deadline - time.monotonic(), 0.1)) for r in want}


# --- the ``swarmtrain`` CLI as real processes (``swarmtrain dht`` + ``swarmtrain join``) ---

SWARMTRAIN = [sys.executable, "-m", "swarmtrain"]
LOOP = ["--host-maddrs", LOOPBACK]


def cli_env(settings: Mapping[str, str] | None = None, *, keep_settings: bool = True) -> dict[str, str]:
    """The environment of a ``swarmtrain`` child: this one's, unbuffered, plus ``settings``
    (``SWARMTRAIN_*`` variables); ``keep_settings=False`` drops the caller's own ``SWARMTRAIN_*`` first."""
    env = {k: v for k, v in os.environ.items() if keep_settings or not k.startswith("SWARMTRAIN_")}
    env.update(settings or {})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_cli_dht(
    tmp: Path, run: str, env: Mapping[str, str], timeout: float = 120.0
) -> tuple[PeerProcess, str]:
    """``swarmtrain dht`` for ``run`` on loopback (output in ``tmp/dht.out``) and the multiaddr it prints."""
    out = tmp / "dht.out"
    proc = spawn_command(
        [*SWARMTRAIN, "dht", *LOOP, "--run-id", run],
        env=dict(env),
        stdout=out.open("w"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)", out.read_text())
        if m:
            return proc, m.group(1)
        assert proc.alive, out.read_text()
        time.sleep(0.2)
    raise AssertionError("the bootstrap node printed no multiaddr")


def spawn_join(
    tmp: Path, name: str, maddr: str, run: str, *args: str, env: Mapping[str, str], config: Path | None = None
) -> PeerProcess:
    """``swarmtrain join`` of ``run`` through ``maddr`` on loopback as peer ``name``: its report in
    ``tmp/<name>.json``, stdout and stderr in ``tmp/<name>.out`` and ``.err``."""
    head = [*SWARMTRAIN, "join", *(["-c", str(config)] if config else [])]
    return spawn_command(
        [*head, "--initial-peers", maddr, "--run-id", run, *LOOP, "--json", str(tmp / f"{name}.json"), *args],
        env=dict(env),
        stdout=(tmp / f"{name}.out").open("w"),
        stderr=(tmp / f"{name}.err").open("w"),
    )


def wait_exit(p: PeerProcess, timeout: float, name: str, tmp: Path) -> None:
    """Assert that peer ``name`` ends within ``timeout`` with exit code 0 (else show its stderr tail)."""
    tail = lambda: (tmp / f"{name}.err").read_text()[-2000:]  # noqa: E731
    assert p.join(timeout), f"{name} did not finish; stderr tail: {tail()}"
    assert p.exitcode == 0, f"{name} exited {p.exitcode}: {tail()}"
