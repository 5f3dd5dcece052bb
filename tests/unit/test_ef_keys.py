"""Error-feedback memory is keyed by what it compresses, not by where it sits in a round (issue 16.2).

The butterfly (``peers.rounds.butterfly.ReduceJob``) once keyed residuals ``reduce/{size}/{i}/{c}``: two
Streaming DiLoCo fragments shared them (a shape error for unequal ones, swapped residuals for equal
ones) and a new group size left the old ones behind. Now parts use one flat memory per tensor set
(``ErrorFeedback.compress_span``), aggregates one per tensor set and partition; the simulation's
report says when a fragment never committed instead of calling the run identical.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
import typer

from compression import ErrorFeedback, Int8Compressor
from peers.reducers import MeanReducer
from peers.rounds.butterfly import Layout, ReduceJob
from peers.rounds.round_io import RoundIO
from peers.wire.messages import encode_packet_bytes
from swarmtrain.core.errors import ConfigError
from swarmtrain.simulation.results import PeerOutcome, SimulationResult, params_identical


def _job(tensors: dict[str, torch.Tensor], n_parts: int, codec: Any, step: int = 4) -> ReduceJob:
    io = cast(RoundIO, SimpleNamespace(kind="reduce", group=SimpleNamespace(size=n_parts)))
    layout = Layout.of(tensors, b"\0" * 16, n_parts, step)
    return ReduceJob(io, layout, codec, codec, MeanReducer(), 1.0)


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors.values()])


def _send_all(job: ReduceJob, tensors: dict[str, torch.Tensor]) -> dict[tuple[int, int], bytes]:
    """Every chunk of every partition encoded as a part, as a non-owner would."""
    flat = _flat(tensors)
    return {
        (i, c): job.encode_part(flat[a:b], i, c)
        for i, chunks in enumerate(job.layout.chunks)
        for c, (a, b) in enumerate(chunks)
    }


def _rand(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def test_equal_size_fragments_never_share_residuals() -> None:
    ef = ErrorFeedback(Int8Compressor())
    frag0, frag1 = {"w0": _rand(10, 0)}, {"w1": _rand(10, 1)}
    _send_all(_job(frag0, 2, ef), frag0)
    got = _send_all(_job(frag1, 2, ef), frag1)
    fresh = _send_all(_job(frag1, 2, ErrorFeedback(Int8Compressor())), frag1)
    assert got == fresh  # fragment 1's first round carries none of fragment 0's residual


def test_unequal_fragments_reduce_without_a_shape_error() -> None:
    ef = ErrorFeedback(Int8Compressor())
    frag0, frag1 = {"a": _rand(6, 2), "b": _rand(4, 3)}, {"c": _rand(17, 4)}
    for _ in range(2):
        _send_all(_job(frag0, 2, ef), frag0)
        _send_all(_job(frag1, 2, ef), frag1)  # raised "key ... was used for shape" before
    assert len(ef.state_dict()["memory"]) == 2  # one flat memory per fragment


def test_a_new_group_size_recuts_the_same_residuals() -> None:
    ef, int8 = ErrorFeedback(Int8Compressor()), Int8Compressor()
    tensors = {"w": _rand(23, 5)}
    _send_all(_job(tensors, 2, ef), tensors)
    (key,) = ef.state_dict()["memory"]
    residual = ef.state_dict()["memory"][key].clone()
    assert residual.abs().max() > 0
    nxt = {"w": _rand(23, 6)}
    job3 = _job(nxt, 3, ef)  # a third peer joined: other partitions, other chunks
    got = _send_all(job3, nxt)
    assert list(ef.state_dict()["memory"]) == [key]  # the same memory, nothing stale beside it
    flat = _flat(nxt)
    for (i, c), frame in got.items():
        a, b = job3.layout.chunks[i][c]
        corrected = (flat[a:b].double() + residual[a:b]).float()
        assert frame == encode_packet_bytes(int8.compress(corrected)), (i, c)


def test_an_aborted_round_leaves_span_memory_as_it_was() -> None:
    ef = ErrorFeedback(Int8Compressor())
    x = _rand(12, 7)
    ef.begin_round()
    ef.compress_span(x[:5], key="k", lo=0, total=12)
    ef.abort_round()
    assert ef.residual("k") is None
    ef.begin_round()
    ef.compress_span(x[:5], key="k", lo=0, total=12)
    ef.commit_round()
    before = ef.residual("k")
    assert before is not None
    kept = before.clone()
    ef.begin_round()
    ef.compress_span(x[5:], key="k", lo=5, total=12)
    ef.compress_span(x[:5] * 3, key="k", lo=0, total=12)
    ef.abort_round()
    after = ef.residual("k")
    assert after is not None and torch.equal(after, kept) and torch.equal(before, kept)  # not in place


def test_a_span_outside_its_vector_is_refused() -> None:
    ef = ErrorFeedback(Int8Compressor())
    with pytest.raises(ConfigError):
        ef.compress_span(torch.ones(4), key="k", lo=10, total=12)
    ef.compress_span(torch.ones(4), key="k", lo=0, total=12)
    with pytest.raises(ConfigError):
        ef.compress_span(torch.ones(4), key="k", lo=0, total=13)


def test_aggregate_memory_follows_the_owners_partition() -> None:
    ef = ErrorFeedback(Int8Compressor())
    tensors = {"w": _rand(20, 8)}
    job2 = _job(tensors, 2, ef)
    a, b = job2.layout.chunks[0][0]
    job2.encode_aggregate(_rand(b - a, 9), 0, 0)
    assert len(ef.state_dict()["memory"]) == 1
    job3 = _job(tensors, 3, ef)
    a, b = job3.layout.chunks[0][0]
    ef.begin_round()
    job3.encode_aggregate(_rand(b - a, 10), 0, 0)
    (key,) = ef.state_dict()["memory"]  # the old partition's memory went: other owners hold it now
    assert key.endswith(f"/{job3.layout.chunks[0][0][0]}:{job3.layout.chunks[0][-1][1]}")
    ef.abort_round()
    (old,) = ef.state_dict()["memory"]  # ... unless the round did not commit
    assert old.endswith(f"/{job2.layout.chunks[0][0][0]}:{job2.layout.chunks[0][-1][1]}")


def _outcome(rank: int, frag: dict[int, dict[str, int]]) -> PeerOutcome:
    return PeerOutcome(
        rank=rank,
        peer_id=f"p{rank}",
        steps=8,
        tokens=100,
        final_train_loss=1.0,
        final_val_loss=1.0,
        final_digest="same",
        sync_digests={1: "d1"},
        committed_rounds=2,
        failed_rounds=2,
        peak_sync_bytes_sent=1,
        comm_wait_s=0.0,
        bytes_sent=1,
        bytes_received=1,
        ledger={},
        wall_s=1.0,
        fragment_rounds=frag,
    )


def _result(outcomes: list[PeerOutcome]) -> SimulationResult:
    return SimulationResult(
        strategy="streaming_diloco",
        compressor="int8",
        peers=len(outcomes),
        steps=8,
        tokens=200,
        final_val_loss=1.0,
        params_identical=params_identical(outcomes),
        admission="token",
        bytes_sent_per_peer=1.0,
        bytes_received_per_peer=1.0,
        wall_s=1.0,
        outcomes=outcomes,
    )


STALLED = {0: {"committed": 0, "failed": 2}, 1: {"committed": 2, "failed": 0}}


def test_a_fragment_that_never_committed_is_not_called_identical() -> None:
    res = _result([_outcome(0, STALLED), _outcome(1, STALLED)])
    assert res.params_identical is False
    assert res.stalled_fragments == [0]
    summary = res.summary()
    assert summary["rounds_per_fragment"] == {
        0: {"committed": 0, "failed": 4},
        1: {"committed": 4, "failed": 0},
    }
    assert summary["stalled_fragments"] == [0]
    ok = {0: {"committed": 1, "failed": 1}, 1: {"committed": 2, "failed": 0}}
    assert _result([_outcome(0, ok), _outcome(1, ok)]).params_identical is True
    assert _result([_outcome(0, {}), _outcome(1, {})]).stalled_fragments == []  # no fragments


def test_simulate_exits_1_in_one_line_when_a_fragment_never_committed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from swarmtrain.app.commands import simulate as sim

    res = _result([_outcome(0, STALLED), _outcome(1, STALLED)])
    monkeypatch.setattr(sim, "_run_one", lambda *a, **k: res)
    opts = sim.SimulateOptions(peers=2, strategy="streaming_diloco", fragments=2, inner_steps=4, steps=8)
    with pytest.raises(typer.Exit) as e:
        sim.run_simulate(opts)
    assert e.value.exit_code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "fragment 0: 4 failed" in err[-1]
