"""The live line of a training peer (``swarmtrain join``): one line that moves with the steps.

On a terminal it is a rich status line redrawn as statuses arrive (several times a second). Piped or
redirected, it becomes a plain, timestamped log line every ``every_s`` seconds, and at once when a
round did not commit (the reason a volunteer should see). The line fits 77 columns (a spinner
beside it: 80); piped, an 8-character timestamp comes before it.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from swarmtrain.app.peer.loop import PeerStatus

__all__ = ["LiveLine", "combine", "format_status", "short_bytes", "short_rate", "short_seconds"]


def short_bytes(n: float) -> str:
    """``1536`` -> ``"1.5K"``: bytes in at most 6 characters, binary units."""
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}T"  # pragma: no cover


def short_seconds(s: float) -> str:
    """``75`` -> ``"1m15s"``, ``8`` -> ``"8s"``."""
    s = max(int(round(s)), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def short_rate(x: float) -> str:
    """``3263.0`` -> ``"3.3k"``, ``812.4`` -> ``"812"``."""
    return f"{x:.0f}" if x < 1000 else f"{x / 1000:.1f}k" if x < 1e6 else f"{x / 1e6:.1f}M"


#: fields a status line drops, in this order, when it would not fit its width
_DROP_ORDER = ("bytes", "rate", "next")


def format_status(s: PeerStatus, width: int = 77, *, total: int | None = None) -> str:
    """``step 120 round 6 (3 trainers) loss 2.781 3.3k tok/s up 24.5M dn 30.7M next round in ~4s``,
    with fields left out (bytes first, then the rate, then the next round's estimate) until it fits
    ``width`` (77: a spinner and the line fit 80 columns). ``peers``: the live trainers as the peer
    last read them (this one included). ``total``: the run's steps, shown as ``step 120/300``.
    While the peer waits (``s.waiting``: a round that has not formed, a download), the line is the
    step and what it waits for, cut to ``width``."""
    step = f"step {s.step}" + (f"/{total}" if total else "")
    if s.waiting:
        return f"{step} {s.waiting}"[:width]
    loss = "-" if s.loss != s.loss else f"{s.loss:.3f}"
    fields = {
        "step": step,
        "round": f"round {s.round_id} ({s.peers} trainer{'' if s.peers == 1 else 's'})",
        "loss": f"loss {loss}",
        "rate": f"{short_rate(s.tokens_per_s)} tok/s",
        "bytes": f"up {short_bytes(s.bytes_up)} dn {short_bytes(s.bytes_down)}",
        "next": "next round in " + ("?" if s.next_sync_s is None else "~" + short_seconds(s.next_sync_s)),
    }
    line = " ".join(fields.values())
    for key in _DROP_ORDER:
        if len(line) <= width:
            break
        del fields[key]
        line = " ".join(fields.values())
    return line


def combine(statuses: list[PeerStatus]) -> PeerStatus:
    """Several peers' latest statuses as one (``simulate``'s line): the slowest peer's step, the
    newest round and its peers, the mean loss, summed rates and bytes, the nearest next sync."""
    from swarmtrain.app.peer.loop import PeerStatus

    losses = [s.loss for s in statuses if s.loss == s.loss]
    syncs = [s.next_sync_s for s in statuses if s.next_sync_s is not None]
    newest = max(statuses, key=lambda s: s.round_id)
    return PeerStatus(
        step=min(s.step for s in statuses),
        round_id=newest.round_id,
        loss=sum(losses) / len(losses) if losses else float("nan"),
        peers=newest.peers,
        bytes_up=sum(s.bytes_up for s in statuses),
        bytes_down=sum(s.bytes_down for s in statuses),
        tokens_per_s=sum(s.tokens_per_s for s in statuses),
        next_sync_s=min(syncs) if syncs else None,
        committed=min(s.committed for s in statuses),
        failed=max(s.failed for s in statuses),
    )


class LiveLine:
    """Shows :class:`PeerStatus` updates; a context manager.

    Args:
        every_s: seconds between plain lines when the output is not a terminal.
        stream: where plain lines go (default stderr).
        terminal: force (``True``/``False``) or detect (``None``) the rich line.
    """

    def __init__(
        self, every_s: float = 10.0, *, stream: TextIO | None = None, terminal: bool | None = None
    ) -> None:
        from rich.console import Console

        self.every_s = every_s
        self.stream = stream or sys.stderr
        self.console = Console(file=self.stream)
        self.terminal = self.console.is_terminal if terminal is None else terminal
        self._status = self.console.status("joining the swarm...") if self.terminal else None
        self._last_plain = float("-inf")
        self._last_note = ""

    def __enter__(self) -> LiveLine:
        if self._status is not None:
            self._status.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._status is not None:
            self._status.stop()

    def update(self, s: PeerStatus) -> None:
        """Show ``s``: redraw the rich line, or print a plain line when one is due."""
        new_note = bool(s.note) and s.note != self._last_note
        if s.note or s.synced:
            self._last_note = s.note
        stamp = time.strftime("%H:%M:%S")
        if self._status is not None:
            if new_note:  # kept above the live line: a reason to read, not to flash by
                self.console.print(f"{stamp} {s.note}", highlight=False, markup=False)
            self._status.update(format_status(s, max(self.console.width - 3, 20)))  # 3: the spinner
            return
        now = time.monotonic()
        if now - self._last_plain < self.every_s and not new_note:
            return
        self._last_plain = now
        print(f"{stamp} {format_status(s)}", file=self.stream, flush=True)
        if new_note:
            print(f"{stamp}   {s.note}", file=self.stream, flush=True)
