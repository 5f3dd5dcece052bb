"""The hivemind side of ``benchmarks/allreduce.py``: ``DecentralizedAverager`` with the matchmaking
settings hivemind's own code uses, and a round that never hangs the benchmark.

Settings: ``min_matchmaking_time`` 5 s and ``request_timeout`` 3 s are the defaults ``hivemind.Optimizer``
gives its averagers (``matchmaking_time=5.0``; the averager's own ``request_timeout=3.0``); hivemind's
``benchmarks/benchmark_averaging.py`` uses the same 5 s matchmaking window (with a 1 s request timeout,
too short for a loaded 2-core machine). The earlier 3 s / 1 s made DHT lookups time out under load.

A round (:func:`hivemind_round`):

1. every peer starts ``step(require_trigger=True)`` (hivemind retries its matchmaking internally until
   the attempt's deadline) and waits until its group is assembled (``AWAITING_TRIGGER``) or the step
   ended; matchmaking is not timed;
2. the peers vote through a shared array: only when *all* hold the full group do they go on;
   otherwise every peer cancels its step and the attempt is repeated (a retry, counted in the JSON)
   with a fresh averager under a new prefix (:class:`Averagers`): a CI run once saw two peers on
   loopback whose every later attempt with the same averagers found no group, until the test's
   limit. Without the vote, one peer whose matchmaking failed retried alone while the others waited
   at the barrier with a group holding it: the run died with "matchmaking did not finish";
3. after a barrier, the all-reduce is timed from ``allow_allreduce()`` to its result.

A round that finds no group in ``attempts`` tries, or whose all-reduce fails, is recorded as failed
(with its reason), never raised: the next round starts from a fresh matchmaking.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "MATCHMAKING_S",
    "REQUEST_TIMEOUT_S",
    "HivemindRound",
    "Averagers",
    "make_averager",
    "hivemind_round",
]

#: ``hivemind.Optimizer``'s ``matchmaking_time`` default (its averager's ``min_matchmaking_time``)
MATCHMAKING_S = 5.0
#: the averager's own ``request_timeout`` default, which ``hivemind.Optimizer`` keeps
REQUEST_TIMEOUT_S = 3.0
#: one matchmaking attempt (hivemind retries inside it until this deadline); a group of peers on
#: loopback forms in about the 5 s matchmaking window, so 30 s is slack on a loaded machine and
#: ``ATTEMPTS`` failed attempts of both rounds of a size fit ``tests/``' 280 s limit
ATTEMPT_S = 30.0
ATTEMPTS = 3
BARRIER_S = 300.0
ALLREDUCE_S = 120.0


@dataclass
class HivemindRound:
    """One round's outcome: ``seconds`` of the all-reduce (``None`` when it failed), the averaged
    vector, the matchmaking attempts repeated, and why it failed (``""`` when it did not)."""

    seconds: float | None
    out: torch.Tensor | None
    retries: int
    failure: str = ""


def make_averager(
    x: torch.Tensor, dht: Any, prefix: str, n: int, matchmaking_s: float = MATCHMAKING_S
) -> Any:
    """A started averager of ``x`` for groups of exactly ``n`` peers, without compression (its 8-bit
    codecs do not decode with numpy >= 2.4 here: docs/architecture.md, Known traps)."""
    import hivemind
    from hivemind.compression import NoCompression

    return hivemind.averaging.DecentralizedAverager(
        [x.clone()],
        dht,
        start=True,
        prefix=prefix,
        target_group_size=n,
        min_group_size=n,
        min_matchmaking_time=matchmaking_s,
        request_timeout=REQUEST_TIMEOUT_S,
        compression=NoCompression(),
    )


class Averagers:
    """A peer's averager of ``x`` for its rounds, renewed (:meth:`renew`) after a failed matchmaking
    attempt: every peer renews at the same vote, so all of them move to the same new prefix."""

    def __init__(self, x: torch.Tensor, dht: Any, prefix: str, n: int, matchmaking_s: float) -> None:
        self._args = (x, dht, n, matchmaking_s)
        self._prefix, self.renewals = prefix, 0
        self.avg = make_averager(x, dht, prefix, n, matchmaking_s)

    def renew(self) -> None:
        """Shut the current averager down and start a fresh one under a new prefix."""
        x, dht, n, matchmaking_s = self._args
        self.shutdown()
        self.renewals += 1
        self.avg = make_averager(x, dht, f"{self._prefix}r{self.renewals}", n, matchmaking_s)

    def shutdown(self) -> None:
        try:
            self.avg.shutdown()
        except Exception as e:  # the other peers leave at the same time: not a result
            print(f"averager shutdown: {type(e).__name__}: {e}", file=sys.stderr)


def _grouped(control: Any, limit_s: float) -> bool:
    """Wait until ``control``'s group is assembled (``True``) or its step ended or ``limit_s`` passed."""
    from hivemind.averaging.control import AveragingStage

    end = time.monotonic() + limit_s
    while time.monotonic() < end and not control.done():
        if control.stage == AveragingStage.AWAITING_TRIGGER:
            return True
        time.sleep(0.01)
    return False


def _all_grouped(ok: bool, rank: int, votes: Any, barrier: Any) -> bool:
    """Whether every peer's matchmaking succeeded: each writes its vote, then reads them all; the
    second barrier keeps a fast peer from overwriting its vote before the others have read it."""
    votes[rank] = int(ok)
    barrier.wait(timeout=BARRIER_S)
    everyone = all(votes[:])
    barrier.wait(timeout=BARRIER_S)
    return everyone


def _matchmake(avgs: Averagers, rank: int, votes: Any, barrier: Any, attempts: int) -> tuple[Any, int]:
    """A step whose group holds every peer, or ``None`` after ``attempts`` tries; and the retries."""
    for attempt in range(attempts):
        control = avgs.avg.step(wait=False, require_trigger=True, timeout=ATTEMPT_S)
        ok = _grouped(control, ATTEMPT_S + 10.0)
        if _all_grouped(ok, rank, votes, barrier):
            return control, attempt
        if not control.done():
            control.cancel()
        avgs.renew()  # every peer voted the same: all of them move to the same fresh prefix
    return None, attempts


def hivemind_round(
    avgs: Averagers, x: torch.Tensor, barrier: Any, votes: Any, rank: int, attempts: int = ATTEMPTS
) -> HivemindRound:
    """One round of hivemind's averager on ``x`` (see the module docstring); never raises for a
    failed matchmaking or all-reduce (a broken barrier, i.e. a peer that died, does raise)."""
    with avgs.avg.get_tensors() as ts:
        ts[0].copy_(x)
    control, retries = _matchmake(avgs, rank, votes, barrier, attempts)  # a renewed one holds x
    if control is None:
        return HivemindRound(
            None, None, retries, f"no group of every peer in {attempts} matchmaking attempts"
        )
    barrier.wait(timeout=BARRIER_S)
    t0 = time.perf_counter()
    control.allow_allreduce()
    try:
        group = control.result(timeout=ALLREDUCE_S)
    except Exception as e:  # hivemind's failures are many types (AllreduceException, P2P errors...)
        return HivemindRound(None, None, retries, f"all-reduce failed: {type(e).__name__}: {e}"[:160])
    dt = time.perf_counter() - t0
    if not group:
        return HivemindRound(None, None, retries, "all-reduce returned no group")
    with avgs.avg.get_tensors() as ts:
        return HivemindRound(dt, ts[0].clone(), retries)
