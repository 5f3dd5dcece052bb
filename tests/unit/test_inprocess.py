"""The in-process collective: weighted mean, reducer hook, codec on both legs, gather, failures."""

from __future__ import annotations

import pytest
import torch
from strategy_helpers import IdentityCompressor, run_threads

from optimizers import InProcessGroup
from swarmtrain.core.errors import ConfigError
from swarmtrain.core.packet import Packet


class HalfCompressor:
    """fp16 codec that counts its calls: shows both legs (own part, result) go through the codec."""

    name = "fp16"

    def __init__(self) -> None:
        self.keys: list[str] = []

    def compress(self, t: torch.Tensor, *, key: str = "") -> Packet:
        self.keys.append(key)
        return Packet("fp16", tuple(t.shape), "float32", (t.to(torch.float16).numpy().tobytes(),))

    def decompress(self, p: Packet) -> torch.Tensor:
        return torch.frombuffer(bytearray(p.buffers[0]), dtype=torch.float16).float().reshape(p.shape)


class MaxReducer:
    name = "max"

    def reduce(self, stack: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return stack.max(0).values


def test_weighted_mean_and_bytes() -> None:
    group = InProcessGroup(3)

    def peer(i: int):
        t = {"a": torch.full((4,), float(i)), "b": torch.full((2, 3), float(10 * i))}
        return group[i].all_reduce(t, compressor=IdentityCompressor(), weight=float(i + 1))

    results = run_threads(peer, 3)
    # weights 1, 2, 3 -> mean of 0, 1, 2 is (0 + 2 + 6) / 6
    for r in results:
        assert r.committed and r.participants == ("inproc-0", "inproc-1", "inproc-2")
        torch.testing.assert_close(r.tensors["a"], torch.full((4,), 8 / 6))
        torch.testing.assert_close(r.tensors["b"], torch.full((2, 3), 80 / 6))
        assert r.bytes_sent == 4 * (4 + 6) and r.bytes_received == 4 * (4 + 6)
    assert all(torch.equal(results[0].tensors["a"], r.tensors["a"]) for r in results)


def test_codec_applies_to_parts_and_result_and_reducer_is_used() -> None:
    group = InProcessGroup(2)
    comps = [HalfCompressor(), HalfCompressor()]

    def peer(i: int):
        t = {"x": torch.tensor([1.0 + 1e-4 * i, -3.0 * i])}
        return group[i].all_reduce(t, compressor=comps[i], reducer=MaxReducer())

    r0, r1 = run_threads(peer, 2)
    assert torch.equal(r0.tensors["x"], r1.tensors["x"])
    torch.testing.assert_close(r0.tensors["x"], torch.tensor([1.0, 0.0]), atol=1e-3, rtol=0)
    assert r0.bytes_sent == 4  # two fp16 values
    assert comps[0].keys == ["x", "x/result"] and comps[1].keys == ["x"]


def test_all_gather_and_injected_failure() -> None:
    group = InProcessGroup(2)
    group.fail_rounds({1})

    def peer(i: int):
        first = group[i].all_gather(bytes([i]) * (i + 1))
        second = group[i].all_gather(b"zz")
        return first, second

    (a1, a2), (b1, b2) = run_threads(peer, 2)
    assert a1.committed and dict(a1.payloads) == {"inproc-0": b"\x00", "inproc-1": b"\x01\x01"}
    assert a1.bytes_sent == 1 and a1.bytes_received == 2 and b1.bytes_received == 1
    assert not a2.committed and not b2.committed and not a2.payloads


def test_failed_reduce_returns_no_tensors() -> None:
    group = InProcessGroup(2)
    group.fail_rounds({0})
    res = run_threads(lambda i: group[i].all_reduce({"x": torch.ones(3)}, compressor=IdentityCompressor()), 2)
    assert all(not r.committed and not r.tensors for r in res)


def test_group_of_one_and_bad_size() -> None:
    r = InProcessGroup(1).members[0].all_reduce({"x": torch.ones(2)}, compressor=IdentityCompressor())
    assert r.committed and r.bytes_sent == 0 and torch.equal(r.tensors["x"], torch.ones(2))
    with pytest.raises(ConfigError):
        InProcessGroup(0)


def test_barrier_timeout_is_an_uncommitted_round() -> None:
    group = InProcessGroup(2)
    r = group[0].all_reduce({"x": torch.ones(1)}, compressor=IdentityCompressor(), timeout=0.2)
    assert not r.committed and "timeout" in r.reason
