"""A userspace TCP delay proxy: latency for emulated links on kernels without ``netem``.

The kernels here have no ``netem`` qdisc, so ``tc`` can cap a link's rate (``tbf``) but not delay
it. This proxy adds the delay in userspace instead: it listens on one address per *target* (a peer's
address as the rest of the swarm knows it), and for every accepted connection it opens one to the
target's real address, then forwards bytes both ways, holding each chunk until ``delay(src, dst)``
seconds after it arrived (``src``: the node the connection came from, known by its source address;
``dst``: the target). So a request and its answer take ``delay(a, b) + delay(b, a)`` more than on a
bare link: a round trip of ``2 * one-way``. The delay is per chunk, not per packet: TCP's own
congestion window sees only the short hop to the proxy, so a long fat link is more forgiving here
than a real one.

The proxy runs an asyncio loop in one thread of the calling process; with ``ns`` that thread enters
a network namespace first (``swarmtrain.simulation.netns.enter``), so every socket it opens lives
there. Each direction buffers at most ``buffer_chunks`` chunks of up to 64 KiB before it stops
reading, so a fast sender is held back rather than buffered without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Target", "DelayProxy"]

logger = logging.getLogger(__name__)

CHUNK = 64 * 1024


@dataclass(frozen=True)
class Target:
    """One destination: where the proxy listens for it and where it really is."""

    node: int
    listen: tuple[str, int]
    connect: tuple[str, int]


class DelayProxy:
    """Forward TCP to each target with a per-(source, target) one-way delay.

    Args:
        targets: the listeners to open.
        delay: seconds to add to bytes going from node ``src`` to node ``dst`` (both directions of a
            connection use it: ``delay(src, dst)`` on the way there, ``delay(dst, src)`` back).
        source_of: the node a connection comes from, by its source IP (None: refused).
        bind_of: the source IP the proxy uses for its own connection on behalf of a node (None: any).
        ns: a network namespace to run in (None: this process's).
        buffer_chunks: chunks buffered per direction before the proxy stops reading.
    """

    def __init__(
        self,
        targets: list[Target],
        delay: Callable[[int, int], float],
        source_of: Callable[[str], int | None],
        bind_of: Callable[[int], str | None] = lambda _src: None,
        *,
        ns: str | None = None,
        buffer_chunks: int = 64,
        connect_timeout: float = 10.0,
    ) -> None:
        self.targets = list(targets)
        self.delay, self.source_of, self.bind_of = delay, source_of, bind_of
        self.ns = ns
        self.buffer_chunks = buffer_chunks
        self.connect_timeout = connect_timeout
        #: bytes forwarded per (from node, to node), both directions counted where they go
        self.bytes: dict[tuple[int, int], int] = {}
        self.connections = 0
        self.refused = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- lifecycle
    def start(self, timeout: float = 10.0) -> DelayProxy:
        """Open every listener (in a thread of its own); raise what failed there."""
        self._thread = threading.Thread(target=self._run, name="swarmtrain-delay-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("the delay proxy did not start")
        if self._error is not None:
            self._thread.join(timeout)
            raise self._error
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listeners and every connection; wait for the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop just ended
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            if self.ns is not None:
                from swarmtrain.simulation.netns import enter

                enter(self.ns)  # this thread only; the loop's helper threads inherit it
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.run_until_complete(self._main())
            loop.close()
        except BaseException as e:  # reported by start(), or logged when it comes later
            if not self._ready.is_set():
                self._error = e
                self._ready.set()
            else:
                logger.error("delay proxy stopped: %s: %s", type(e).__name__, e)

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        servers = []
        for t in self.targets:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(t.listen)
            sock.listen(256)
            sock.setblocking(False)

            async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter, t: Target = t) -> None:
                with contextlib.suppress(asyncio.CancelledError):  # the proxy is stopping: no noise
                    await self._connection(t, r, w)

            servers.append(await asyncio.start_server(handle, sock=sock, limit=CHUNK))
        self._ready.set()
        tasks = set()
        try:
            await self._stop.wait()
        finally:
            for s in servers:
                s.close()
            tasks = {x for x in asyncio.all_tasks() if x is not asyncio.current_task()}
            for x in tasks:
                x.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- one connection
    async def _connection(
        self, t: Target, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = writer.get_extra_info("peername")
        src = self.source_of(str(peer[0])) if peer else None
        if src is None:
            self.refused += 1
            writer.close()
            return
        loop = asyncio.get_running_loop()
        out = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        out2: asyncio.StreamWriter | None = None
        try:
            out.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            bind = self.bind_of(src)
            if bind is not None:
                out.bind((bind, 0))
            out.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(out, t.connect), self.connect_timeout)
            r2, out2 = await asyncio.open_connection(sock=out, limit=CHUNK)
            self.connections += 1
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pipes = [
                asyncio.ensure_future(self._pipe(reader, out2, self.delay(src, t.node), (src, t.node))),
                asyncio.ensure_future(self._pipe(r2, writer, self.delay(t.node, src), (t.node, src))),
            ]
            try:
                done, _ = await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
                for d in done:
                    d.result()  # a failed direction ends the connection
            finally:
                for p in pipes:
                    p.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            logger.debug("proxy %s -> %s: %s", src, t.node, e)
        finally:
            for w in (writer, out2):
                if w is not None:
                    w.close()
            if out2 is None:
                out.close()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, key: tuple[int, int]
    ) -> None:
        """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it arrived; pass EOF on."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(self.buffer_chunks)

        async def pump() -> None:
            try:
                while True:
                    data = await reader.read(CHUNK)
                    await q.put((loop.time() + delay, data))
                    if not data:
                        return
            except OSError:
                await q.put((loop.time(), b""))
                raise

        async def drain() -> None:
            while True:
                due, data = await q.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof() and not writer.is_closing():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
                self.bytes[key] = self.bytes.get(key, 0) + len(data)

        pumping = asyncio.ensure_future(pump())
        try:
            await drain()
        finally:
            if not pumping.done():
                pumping.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await pumping
