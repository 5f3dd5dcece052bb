"""Phase timing of a collective round (``peers.rounds.phases``): wall and CPU seconds per phase, the
exchange's sub-phases kept out of the phases' sum (the sum is what the deadline estimate samples)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import torch

from compression import build_compressor
from peers.reducers import build_reducer
from peers.rounds.butterfly import ButterflyRound, NoCheck
from peers.rounds.group import Group, group_digest
from peers.rounds.phases import PhaseClock, Phases, Stopwatch
from peers.rounds.round_io import RoundIO, RoundLink
from peers.wire.mailbox import Mailbox
from peers.wire.messages import Envelope
from swarmtrain.core.config import CompressionConfig


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_mark_books_wall_and_cpu_per_phase() -> None:
    clock = PhaseClock()
    _spin(0.05)
    clock.mark("busy")
    time.sleep(0.05)
    clock.mark("idle")
    ph = clock.phases
    assert list(ph) == ["busy", "idle"] and set(ph.cpu) == {"busy", "idle"}
    assert ph["busy"] >= 0.05 and ph["idle"] >= 0.05
    assert ph.cpu["busy"] > 0.02  # spinning costs CPU...
    assert ph.cpu["idle"] < 0.03  # ...sleeping does not
    assert ph.flat()["wall"]["busy"] == ph["busy"]


def test_stopwatch_laps_are_details_outside_the_sum() -> None:
    clock = PhaseClock()
    laps = Stopwatch(clock, "exchange")
    for _ in range(3):
        time.sleep(0.01)
        laps.lap("wait")
        laps.lap("decode")
    clock.mark("exchange")
    ph = clock.phases
    assert list(ph) == ["exchange"]
    assert set(ph.detail) == {"exchange.wait", "exchange.decode"}
    assert ph.detail["exchange.wait"] >= 0.03
    assert ph.detail["exchange.wait"] + ph.detail["exchange.decode"] <= ph["exchange"]
    assert set(ph.flat()["cpu"]) == {"exchange", "exchange.wait", "exchange.decode"}


def test_a_butterfly_rounds_phases_sum_to_its_duration() -> None:
    """The phases partition the round: the exchange's sub-phases are details, not phases (booked
    among the phases, the exchange would count twice in the deadline estimate's sample)."""

    def send(peer: str, env: Envelope, frames: list[Any], deadline: float) -> Future[None]:
        raise AssertionError("a one-member round sends nothing")

    link = RoundLink("A", "run", Mailbox(1 << 20), send, lambda: None)
    group = Group("reduce", 0, ("A",), "A", group_digest("run", "reduce", 0, ("A",)), 0)
    t0 = time.perf_counter()  # before the clock starts: its phases run from its creation
    clock = PhaseClock()
    io = RoundIO(link, group, "reduce", time.monotonic() + 5.0, clock)
    comp = build_compressor(CompressionConfig(codec="int8"))
    ButterflyRound(io, {"x": torch.randn(1 << 16)}, comp, build_reducer("mean"), 1.0, NoCheck(), 4096).run()
    total = time.perf_counter() - t0
    ph = clock.phases
    assert isinstance(ph, Phases)
    assert list(ph) == ["encode_parts", "exchange", "wait_sends"]
    assert {"exchange.wait", "exchange.reduce_send_aggs", "exchange.decode_aggs"} <= set(ph.detail)
    assert sum(ph.values()) <= total
    assert ph.detail["exchange.reduce_send_aggs"] > 0 and ph.cpu["exchange"] > 0
