"""The dashboard's memory of a run: what successive polls of the peer records showed, bounded.

Each :meth:`History.update` takes one poll (the live peer records and the current bans) and keeps:

* per peer, a series of points ``(time, step, round, loss, bytes_sent, bytes_received, throughput)``,
  one each time the peer's step, round or loss changed (the loss curve: trainers publish their step
  and loss every few seconds, so a point every few steps, not one per round), and the whole-step
  ticks of the curve's x axis (:func:`step_ticks`);
* per round, the bytes the peers' ledgers counted between polls, attributed to the round each peer
  reported (bytes per round);
* a timeline of round outcomes: when a peer's ``committed``/``late``/``failed`` count grows, one
  event per outcome with how many rounds it covers (counts a peer had before the dashboard first
  saw it are shown in the table, not replayed);
* the total throughput of the live peers at each poll, and the bans with when they were first seen;
* per volunteer, its contribution (:meth:`History.contributions`): the tokens of its own steps in
  the rounds it committed, and those rounds, as its record claims them, kept after it left and
  summed over its restarts (a restarted peer's counters start again at 0: what it had is banked).

Everything is bounded (``max_points`` per series and overall for the lists), so a dashboard left
running for days uses constant memory. Thread-safe: the poller writes, the web server reads.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from peers.dht.records import PeerRecord

__all__ = ["History", "OUTCOMES", "step_ticks"]

OUTCOMES = ("committed", "late", "failed")
_NOT_WORKERS = frozenset({"bootstrap", "monitor"})  # roles that train nothing (no throughput)


def _count(rec: PeerRecord, key: str) -> int:
    """An outcome counter of the record's ``extra`` (0 when absent or not a count: older peers)."""
    v = rec.extra.get(key, 0)
    return int(v) if isinstance(v, int | float) and math.isfinite(v) and v >= 0 else 0


@dataclass
class _Peer:
    """What the history remembers of one peer, including after it left."""

    points: deque[tuple[float, int, int, float, int, int, float]]
    last: PeerRecord | None = None
    counts: dict[str, int] = field(default_factory=dict)
    banked_tokens: int = 0  # contributed before its counters last restarted (a restart)
    banked_rounds: int = 0
    first_seen: float = 0.0
    last_seen: float = 0.0


class History:
    """Bounded history of a run's peer records, fed one poll at a time.

    Args:
        run_id: the run shown (for the page's title).
        max_points: points kept per peer, and rounds / timeline events / throughput samples kept.
        max_peers: peers remembered; the ones not seen for longest are forgotten first.
    """

    def __init__(self, run_id: str, *, max_points: int = 1000, max_peers: int = 256) -> None:
        if max_points < 1 or max_peers < 1:
            raise ValueError("History needs max_points >= 1 and max_peers >= 1")
        self.run_id = run_id
        self.max_points = max_points
        self.max_peers = max_peers
        self._lock = threading.Lock()
        self._peers: dict[str, _Peer] = {}
        self._live: list[PeerRecord] = []
        self._rounds: dict[int, list[int]] = {}  # round -> [bytes sent, bytes received, peers]
        self._timeline: deque[dict[str, Any]] = deque(maxlen=max_points)
        self._throughput: deque[tuple[float, float, int]] = deque(maxlen=max_points)
        self._bans: dict[str, tuple[str, float]] = {}  # peer -> (reason, first seen)
        self._polls = 0
        self._updated = 0.0
        self._error: str | None = None

    # --- writing (the poller) -------------------------------------------------------------------------

    def update(self, records: list[PeerRecord], bans: dict[str, str], now: float) -> None:
        """Fold one poll in: the live records and the bans (peer -> reason) read at ``now``."""
        with self._lock:
            self._polls += 1
            self._updated = now
            self._error = None
            self._live = sorted(records, key=lambda r: r.peer_id)
            for rec in self._live:
                self._fold(rec, now)
            workers = [r for r in self._live if r.role not in _NOT_WORKERS]
            self._throughput.append((now, sum(r.throughput for r in workers), len(workers)))
            self._bans = {p: (why, self._bans.get(p, (why, now))[1]) for p, why in bans.items()}
            self._forget_old_peers()

    def note_error(self, message: str, now: float) -> None:
        """A poll failed (the DHT did not answer...): shown on the page until the next good poll."""
        with self._lock:
            self._error = message
            self._updated = now

    def _fold(self, rec: PeerRecord, now: float) -> None:
        p = self._peers.get(rec.peer_id)
        if p is None:
            p = self._peers[rec.peer_id] = _Peer(points=deque(maxlen=self.max_points), first_seen=now)
        prev = p.last
        if prev is not None and (
            rec.contributed_tokens < prev.contributed_tokens or rec.committed_rounds < prev.committed_rounds
        ):  # its counters went back: the peer restarted (same identity), what it had still counts
            p.banked_tokens += prev.contributed_tokens
            p.banked_rounds += prev.committed_rounds
        p.last, p.last_seen = rec, now
        moved = (
            prev is None or (rec.step, rec.round) != (prev.step, prev.round) or not _same(rec.loss, prev.loss)
        )
        if moved:
            p.points.append(
                (now, rec.step, rec.round, rec.loss, rec.bytes_sent, rec.bytes_received, rec.throughput)
            )
        if prev is not None:
            sent = max(rec.bytes_sent - prev.bytes_sent, 0)  # a restarted peer's ledger starts at 0
            recv = max(rec.bytes_received - prev.bytes_received, 0)
            if sent or recv:
                row = self._rounds.setdefault(rec.round, [0, 0, 0])
                row[0] += sent
                row[1] += recv
                row[2] += 1
                while len(self._rounds) > self.max_points:
                    del self._rounds[min(self._rounds)]
        counts = {k: _count(rec, k) for k in OUTCOMES}
        if prev is not None:
            for k in OUTCOMES:
                grew = counts[k] - p.counts.get(k, 0)
                if grew > 0:
                    self._timeline.append(
                        {"t": now, "peer": rec.peer_id, "round": rec.round, "outcome": k, "n": grew}
                    )
        p.counts = counts

    def _forget_old_peers(self) -> None:
        if len(self._peers) <= self.max_peers:
            return
        live = {r.peer_id for r in self._live}
        gone = sorted((p.last_seen, pid) for pid, p in self._peers.items() if pid not in live)
        for _, pid in gone[: len(self._peers) - self.max_peers]:
            del self._peers[pid]

    # --- reading (the web server) ---------------------------------------------------------------------

    def snapshot(self, now: float) -> dict[str, Any]:
        """The whole state as plain JSON-able data (NaN losses stay floats; ``jsonsafe`` nulls them)."""
        with self._lock:
            peers = [self._row(r, now) for r in self._live]
            series = {
                pid: {
                    "live": any(r.peer_id == pid for r in self._live),
                    "points": [list(pt) for pt in p.points],
                }
                for pid, p in self._peers.items()
                if p.points
            }
            totals = {k: sum(row[k] for row in peers) for k in OUTCOMES}
            steps = [pt[1] for p in self._peers.values() for pt in p.points if not math.isnan(pt[3])]
            return {
                "run_id": self.run_id,
                "now": now,
                "updated": self._updated,
                "polls": self._polls,
                "error": self._error,
                "peers": peers,
                "series": series,
                "rounds": [
                    {"round": r, "bytes_sent": v[0], "bytes_received": v[1], "peers": v[2]}
                    for r, v in sorted(self._rounds.items())
                ],
                "timeline": list(self._timeline),
                "throughput": [list(x) for x in self._throughput],
                "bans": [
                    {"peer": pid, "reason": why, "since": since}
                    for pid, (why, since) in sorted(self._bans.items())
                ],
                "totals": totals,
                "contributions": self._contributions(),
                # the loss curve's x axis: whole steps (the page draws these ticks)
                "step_ticks": step_ticks(min(steps), max(steps)) if steps else [],
            }

    def _contributions(self) -> list[dict[str, Any]]:
        """One row per peer that trains (live or gone): its tokens in committed rounds and those
        rounds over all the polls (restarts summed), its share of the tokens, biggest first."""
        rows: list[dict[str, Any]] = []
        for pid, p in self._peers.items():
            if p.last is None or p.last.role in _NOT_WORKERS:
                continue
            tokens = p.banked_tokens + p.last.contributed_tokens
            rounds = p.banked_rounds + p.last.committed_rounds
            rows.append(
                {
                    "peer": pid,
                    "live": any(r.peer_id == pid for r in self._live),
                    "tokens": tokens,
                    "rounds": rounds,
                    "first_seen": p.first_seen,
                    "last_seen": p.last_seen,
                }
            )
        total = sum(r["tokens"] for r in rows)
        for r in rows:
            r["share"] = r["tokens"] / total if total else 0.0
        return sorted(rows, key=lambda r: (-r["tokens"], r["peer"]))

    def contributions(self) -> list[dict[str, Any]]:
        """Each volunteer's contribution so far (see the module docstring), biggest first."""
        with self._lock:
            return self._contributions()

    def _row(self, r: PeerRecord, now: float) -> dict[str, Any]:
        ban = self._bans.get(r.peer_id)
        outcome = r.extra.get("outcome", "")
        return {
            "peer": r.peer_id,
            "role": r.role,
            "region": r.region,
            "step": r.step,
            "round": r.round,
            "loss": r.loss,
            "throughput": r.throughput,
            "bytes_sent": r.bytes_sent,
            "bytes_received": r.bytes_received,
            "contributed_tokens": r.contributed_tokens,
            "committed_rounds": r.committed_rounds,
            "version": r.version,
            **{k: _count(r, k) for k in OUTCOMES},
            "outcome": outcome if outcome in OUTCOMES else "",
            "banned": ban[0] if ban else None,
            "seen_ago": max(now - r.time, 0.0) if r.time else None,
        }


def step_ticks(lo: float, hi: float, n: int = 6) -> list[int]:
    """About ``n`` tick values for a step axis from ``lo`` to ``hi``: whole steps, a 1-2-5 spacing of at
    least one step, each once (a range of one or two steps got ticks 30, 30.2, ... shown as
    ``30 30 30 31 31 31``)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi < lo:
        return []
    raw = max((hi - lo) / max(n, 1), 1.0)
    p = 10 ** math.floor(math.log10(raw))
    f = raw / p
    step = int((1 if f < 1.5 else 2 if f < 3 else 5 if f < 7 else 10) * p)
    first = math.ceil(lo / step) * step
    return list(range(first, math.floor(hi) + 1, step)) or [math.floor(lo)]


def _same(a: float, b: float) -> bool:
    """Equal, counting NaN as equal to NaN (no loss yet, twice, is no change)."""
    return a == b or (math.isnan(a) and math.isnan(b))
