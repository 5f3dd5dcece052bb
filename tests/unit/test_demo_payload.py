"""DeMo payload packing: round trips, tight sizes, and strict rejection of malformed peer bytes."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategy_helpers import IdentityCompressor, InProcessGroup, backward, batch, make_model, run_threads

from optimizers import StrategyContext, build_strategy
from optimizers.demo_payload import TensorSpec, decode_payload, encode_payload, index_dtype, max_payload_bytes
from swarmtrain.core.config import CompressionConfig, DeMoConfig
from swarmtrain.core.errors import ConfigError, ProtocolError
from swarmtrain.core.protocols import GatherResult

SPECS = [TensorSpec(4, 3, 16), TensorSpec(2, 2, 300)]


def _items(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in SPECS:
        idx = torch.stack([torch.randperm(s.chunk_numel, generator=g)[: s.k] for _ in range(s.n_chunks)])
        out.append((idx, torch.randn(s.n_chunks, s.k, generator=g)))
    return out


@pytest.mark.parametrize("mode", ["fp32", "fp16", "bf16", "sign"])
def test_round_trip_and_size(mode: str) -> None:
    items = _items()
    data = encode_payload(items, SPECS, mode)
    back = decode_payload(data, SPECS, mode)
    for (i0, v0), (i1, v1) in zip(items, back, strict=True):
        assert torch.equal(i0, i1)
        if mode == "fp32":
            assert torch.equal(v0, v1)
        elif mode == "sign":
            assert torch.equal(torch.sign(v1), torch.where(v0 >= 0, 1.0, -1.0))
        else:
            torch.testing.assert_close(v1, v0, rtol=1e-2, atol=1e-2)
    assert len(data) <= max_payload_bytes(SPECS, mode)
    val_bytes = {"fp32": 4, "fp16": 2, "bf16": 2}.get(mode)
    # 12 uint8 + 4 uint16 indices; 16 values (or 2 + 1 bytes of sign bits and two fp32 scales)
    body = 12 * 1 + 4 * 2 + (16 * val_bytes if val_bytes else 2 + 1 + 8)
    assert 0 < len(data) - body < 40  # msgpack framing overhead only


def test_index_dtype_is_the_narrowest() -> None:
    assert index_dtype(256).itemsize == 1 and index_dtype(257).itemsize == 2
    assert index_dtype(65536).itemsize == 2 and index_dtype(65537).itemsize == 4


def _repack(mutate: Any) -> bytes:
    obj = msgpack.unpackb(encode_payload(_items(), SPECS, "fp32"), raw=False)
    mutate(obj)
    return msgpack.packb(obj, use_bin_type=True)


def _set_idx(obj: dict[str, Any], value: int) -> None:
    arr = np.frombuffer(obj["t"][0][0], dtype="<u1").copy()
    arr[0] = value
    obj["t"][0][0] = arr.tobytes()


def _dup_idx(obj: dict[str, Any]) -> None:
    arr = np.frombuffer(obj["t"][0][0], dtype="<u1").copy()
    arr[1] = arr[0]
    obj["t"][0][0] = arr.tobytes()


def _nan(obj: dict[str, Any]) -> None:
    arr = np.frombuffer(obj["t"][1][1], dtype="<f4").copy()
    arr[0] = np.nan
    obj["t"][1][1] = arr.tobytes()


BAD = {
    "not msgpack": b"\xc1\xc1\xc1",
    "truncated": encode_payload(_items(), SPECS, "fp32")[:-5],
    "oversized": b"\x00" * 10_000,
    "not a map": msgpack.packb([1, 2, 3]),
    "version": _repack(lambda o: o.update(v=2)),
    "mode": _repack(lambda o: o.update(vals="fp16")),
    "extra key": _repack(lambda o: o.update(x=1)),
    "tensor count": _repack(lambda o: o["t"].pop()),
    "short idx": _repack(lambda o: o["t"][0].__setitem__(0, o["t"][0][0][:-1])),
    "idx range": _repack(lambda o: _set_idx(o, 16)),
    "duplicate": _repack(_dup_idx),
    "nan": _repack(_nan),
    "entry type": _repack(lambda o: o["t"].__setitem__(0, "abc")),
    "scale in fp32": _repack(lambda o: o["t"][0].__setitem__(2, b"\x00\x00\x80\x3f")),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_payloads_raise_protocol_error(name: str) -> None:
    with pytest.raises(ProtocolError):
        decode_payload(BAD[name], SPECS, "fp32")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_only_ever_raise_protocol_error(data: bytes) -> None:
    try:
        decode_payload(data, SPECS, "fp32")
    except ProtocolError:
        pass


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 1000), st.integers(0, 255))
def test_single_byte_corruption_is_caught_or_harmless(pos: int, byte: int) -> None:
    data = bytearray(encode_payload(_items(), SPECS, "fp16"))
    data[pos % len(data)] = byte
    try:
        out = decode_payload(bytes(data), SPECS, "fp16")
    except ProtocolError:
        return
    for (idx, val), s in zip(out, SPECS, strict=True):  # accepted -> within every bound
        assert idx.shape == (s.n_chunks, s.k) and int(idx.max()) < s.chunk_numel
        assert bool(torch.isfinite(val).all())


def test_encode_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        encode_payload(_items(), SPECS, "int3")
    with pytest.raises(ConfigError):
        encode_payload(_items()[:1], SPECS, "fp32")


class Corrupting:
    """A real in-process member whose outgoing DeMo payloads are garbage (a faulty peer)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def peer_id(self) -> str:
        return str(self.inner.peer_id)

    def all_reduce(self, *a: Any, **kw: Any) -> Any:
        return self.inner.all_reduce(*a, **kw)

    def all_gather(self, payload: bytes, **kw: Any) -> GatherResult:
        return self.inner.all_gather(b"\x93\x01\x02" + payload[3:], **kw)  # type: ignore[no-any-return]


def test_bad_peer_is_dropped_and_honest_peers_stay_identical() -> None:
    group = InProcessGroup(3)

    def peer(i: int) -> tuple[list[float], dict[str, torch.Tensor]]:
        model = make_model()
        coll = Corrupting(group[i]) if i == 2 else group[i]
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        cfg = DeMoConfig(demo_chunk=8, demo_topk=2)
        strat = build_strategy(
            StrategyContext(model, opt, cfg, CompressionConfig(), coll, None, IdentityCompressor())
        )
        dropped = []
        for s in range(3):
            backward(model, *batch(i, s))
            dropped.append(strat.step(16).extra["dropped_payloads"])
        return dropped, {k: v.detach() for k, v in model.named_parameters()}

    (d0, p0), (d1, p1), (d2, _) = run_threads(peer, 3)
    assert d0 == d1 == d2 == [1.0, 1.0, 1.0]
    assert all(torch.equal(p0[k], p1[k]) for k in p0)
