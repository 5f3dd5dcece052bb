"""The step requests a stage server holds: a trainer's close of a step is answered only once the step
is taken (or given up), so every trainer of the step learns of it at the same moment.

A request reaches the server's worker thread as a :class:`Job` (its frames and the event-loop future
its stream handler waits on); :class:`HeldCloses` keeps the closes of the current step, in order,
and answers or refuses them all at once (worker thread only).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from peers.wire.messages import Envelope
from swarmtrain.core.errors import ProtocolError

__all__ = ["HeldCloses", "Job", "resolve"]


@dataclass
class Job:
    """One request handed from the stream handler (event loop) to the worker thread."""

    env: Envelope
    frames: list[bytes]
    fut: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    sender: str = ""

    def answer(self, value: Any) -> None:
        """Resolve the handler's future with ``value`` (an exception is raised there), thread-safe."""
        self.loop.call_soon_threadsafe(resolve, self.fut, value)


def resolve(fut: asyncio.Future[Any], value: Any) -> None:
    """Set ``fut``'s result, or its exception when ``value`` is one (unless it is already done)."""
    if fut.done():
        return
    if isinstance(value, BaseException):
        fut.set_exception(value)
    else:
        fut.set_result(value)


class HeldCloses:
    """The closes of one step, waiting for the step to be taken (worker thread only)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self._first = 0.0  # when the step's first close came

    def hold(self, job: Job) -> None:
        if not self.jobs:
            self._first = time.monotonic()
        self.jobs.append(job)

    def before(self, step: int) -> bool:
        """Whether the held closes are of a step before ``step`` (the stage went on without them)."""
        return bool(self.jobs) and self.jobs[0].env.round < step

    def overdue(self, timeout: float) -> bool:
        """Whether closes are held and the first came more than ``timeout`` seconds ago."""
        return bool(self.jobs) and time.monotonic() - self._first > timeout

    def answer(self, value: Any) -> None:
        """Answer every held close with ``value`` (a reply or an exception) and hold none."""
        for job in self.jobs:
            job.answer(value)
        self.jobs = []

    def refuse(self, why: str) -> None:
        self.answer(ProtocolError(why))
