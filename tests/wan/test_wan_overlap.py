"""Opt-in (``SWARMTRAIN_WAN=1``, root): DiLoCo and StreamingDiLoCo over rate-capped emulated links.

Four peers and a bootstrap node in network namespaces joined by veth pairs to a bridge, each link
capped with ``tc tbf`` (``swarmtrain.simulation.netns``, ``benchmarks/wan_overlap.py``). Checked here:
the cap is in place and enforced (a raw TCP transfer cannot beat it), both strategies train over the
capped links with identical global parameters on every peer, both learned (the final validation loss
is well below the same model's loss at step 0, measured here on the same validation batches), DiLoCo's
reported wait per sync is at least what the cap physically forces for the bytes it sent, and no
namespace is left behind. The
utilization comparison itself is a speed claim: it lives in the benchmark's JSON, not in an assert.

When the environment is broken (no ``ip netns``, no ``tbf``), these tests fail with the command's
error; they skip only when not run as root.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import wan_overlap  # noqa: E402

from swarmtrain.core.config import load_config  # noqa: E402
from swarmtrain.simulation import netns as wan_netns  # noqa: E402

pytestmark = [
    pytest.mark.wan,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and tc need root (euid 0)"),
]

RATE_MBIT = 20.0
# How far below its step-0 validation loss a run must end. An unchanged model scores exactly its
# step-0 loss (fixed batches, no dropout), which for the tiny preset is already below uniform
# (5.38 < ln 256 = 5.545), so the old "< 5.55" passed for a model that learned nothing. Measured with
# these quick settings (20 steps, H=10; benchmarks/results/wan_overlap_quick.json): 5.38 -> 3.32
# (DiLoCo) and 3.63 (StreamingDiLoCo), drops of 2.06 and 1.76 nats; the full benchmark (40 steps,
# H=20) 5.38 -> 3.10. One nat is about half the smaller drop: only training gets there.
LEARNED_MARGIN = 1.0


def test_tbf_cap_is_enforced_and_namespaces_are_removed() -> None:
    with wan_netns.Wan(2, RATE_MBIT) as wan:
        assert "tbf" in wan.qdiscs(0) and "20Mbit" in wan.qdiscs(0)
        nbytes = 2_000_000
        secs = wan.transfer(0, 1, nbytes)
        # the bucket lets at most its burst through at once; the rest needs nbytes*8/rate seconds
        floor = (nbytes * 8 - 64_000) / (RATE_MBIT * 1e6)
        assert secs >= 0.9 * floor, f"{nbytes} B in {secs:.3f} s beats a {RATE_MBIT} Mbit/s cap"
    assert wan_netns.namespaces() == []
    with wan_netns.Wan(2, None) as wan:  # uncapped: the same transfer goes through (connectivity)
        assert wan.transfer(0, 1, nbytes) > 0
    assert wan_netns.namespaces() == []


def test_diloco_and_streaming_train_over_capped_links() -> None:
    s = wan_overlap.settings(quick=True)
    start = wan_overlap.initial_val_loss(s)
    assert 5.0 < start < 6.0, start  # an untrained byte model: about ln 256
    rows = {}
    try:
        with wan_netns.Wan(s["peers"] + 1, s["rate_mbit"]) as wan:
            for name in ("diloco", "streaming_diloco"):
                cfg = load_config(None, {**s["shared"], **s[name]}, env={})
                rows[name] = wan_overlap.run_wan(wan, cfg, s["peers"], timeout=600)
    finally:
        assert wan_netns.namespaces() == []
    h = s["shared"]["strategy.inner_steps"]
    steps = s["shared"]["train.steps"]
    for name, run in rows.items():
        summary = run.summary()
        assert summary["params_identical"], name
        assert all(o.steps == steps for o in run.outcomes), name
        assert all(f == 0 for f in summary["failed_rounds"]), name
        assert summary["bytes_sent_per_peer"] > 0
        # learned: well below where the same model started (see LEARNED_MARGIN)
        assert summary["final_val_loss"] < start - LEARNED_MARGIN, (name, summary["final_val_loss"], start)
    dl = rows["diloco"]
    assert all(o.committed_rounds == steps // h for o in dl.outcomes)
    # a DiLoCo sync cannot end before every owner has this peer's part (about half of what it sends;
    # its result parts may still sit in socket buffers when the call returns), and those bytes go
    # through a link capped at RATE_MBIT: step() must have blocked at least that long (minus a burst)
    for o in dl.outcomes:
        forced = (o.bytes_sent / 2 * 8 - o.committed_rounds * 64_000) / (RATE_MBIT * 1e6)
        assert o.comm_wait_s >= 0.9 * forced, (o.rank, o.comm_wait_s, forced)
    sd = rows["streaming_diloco"]
    frags = s["streaming_diloco"]["strategy.fragments"]
    assert all(o.peak_sync_bytes_sent < dl.outcomes[0].peak_sync_bytes_sent for o in sd.outcomes)
    assert all(o.committed_rounds >= (steps // h) * frags - 1 for o in sd.outcomes)
