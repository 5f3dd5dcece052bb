"""``compression.staging``: pooled host buffers, staged packets identical to the plain path, scatter
frames; the CUDA tests (``-k cuda``) check pinned buffers, streams and bit-identity on a GPU."""

from __future__ import annotations

import asyncio

import pytest
import torch

from compression import Int4Compressor, Int8Compressor, TernaryCompressor, staging
from peers.wire.messages import FrameParts, decode_packet_bytes, encode_packet_bytes, frame_parts
from peers.wire.transport import write_frame_drained
from swarmtrain.core.errors import UpdateRejected
from swarmtrain.core.wire import encode_packet

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def _codecs() -> list[tuple[str, object]]:
    return [
        ("int8", lambda dev="cpu": Int8Compressor(block=64, device=dev)),
        ("int4", lambda dev="cpu": Int4Compressor(block=64, device=dev)),
        ("ternary", lambda dev="cpu": TernaryCompressor(block=64, seed=3, device=dev)),
        ("ternary-c", lambda dev="cpu": TernaryCompressor(block=64, seed=3, device=dev, contractive=True)),
    ]


CODECS = _codecs()
SIZES = [0, 1, 63, 64, 1000, 4099]


def test_pool_reuses_a_released_buffer_of_the_same_bucket() -> None:
    pool = staging.PinnedPool(pin=False)
    a = pool.acquire(1000)
    assert a.numel() == 1 << 16 and a.dtype == torch.uint8
    pool.release(a)
    b = pool.acquire(5000)  # same 64 KiB bucket
    assert b.data_ptr() == a.data_ptr() and pool.hits == 1 and pool.misses == 1
    c = pool.acquire(70_000)  # next bucket: a fresh buffer
    assert c.numel() == 1 << 17 and pool.misses == 2


def test_pool_bounds_its_idle_buffers() -> None:
    pool = staging.PinnedPool(max_idle_bytes=3 << 16, per_bucket=2, pin=False)
    bufs = [pool.acquire(10) for _ in range(3)]
    for b in bufs:
        pool.release(b)
    assert pool.dropped == 1 and pool.idle_bytes == 2 << 16
    big = pool.acquire(1 << 17)
    pool.release(big)  # 2 * 64 KiB + 128 KiB > 3 * 64 KiB
    assert pool.dropped == 2 and pool.idle_bytes == 2 << 16
    pool.clear()
    assert pool.idle_bytes == 0


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name,make", CODECS, ids=[c[0] for c in CODECS])
def test_staged_packet_is_the_plain_packet(name: str, make, n: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3
    pool = staging.PinnedPool(pin=False)
    s = staging.stage(make(), x, key="k", pool=pool)
    plain = make().compress(x, key="k")
    assert s.packet() == plain
    assert b"".join(bytes(p) for p in s.wire_parts()) == encode_packet(plain)
    s.release()
    assert pool.idle_bytes > 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_staged_packet_of_half_inputs(dtype: torch.dtype) -> None:
    x = torch.randn(333, generator=torch.Generator().manual_seed(1)).to(dtype)
    for _, make in CODECS:
        assert staging.stage(
            make(), x, key="h", pool=staging.PinnedPool(pin=False)
        ).packet() == make().compress(x, key="h")


def test_compress_many_keeps_order_and_counters() -> None:
    x = torch.randn(5000, generator=torch.Generator().manual_seed(2))
    items = [(x[a : a + 1024], f"v/{a}") for a in range(0, 5000, 1024)]
    for _, make in CODECS:
        a, b = make(), make()
        got = [s.packet() for s in staging.compress_many(a, items, depth=3)]
        assert got == [b.compress(t, key=k) for t, k in items]
        assert list(staging.compress_many(b, [])) == []
    pool = staging.PinnedPool(pin=False)
    for s in staging.compress_many(Int8Compressor(), items, pool=pool):
        s.release()  # CPU tensors take the plain path: no pooled buffer
    assert pool.misses == 0


def test_non_finite_input_is_refused_when_staged() -> None:
    x = torch.ones(100)
    x[7] = float("inf")
    pool = staging.PinnedPool(pin=False)
    s = staging.stage(Int8Compressor(), x, pool=pool)
    with pytest.raises(UpdateRejected):
        s.wait()
    assert pool.idle_bytes > 0  # released on the refusal
    x[7] = float("nan")
    with pytest.raises(UpdateRejected):
        staging.stage(TernaryCompressor(), x, pool=pool).packet()


def test_cpu_and_other_devices_take_the_plain_path() -> None:
    assert not staging.stages(Int8Compressor(), torch.zeros(4))
    src = torch.arange(10, dtype=torch.float32)
    assert staging.to_device(src, torch.device("cpu")) is src


def test_frame_parts_go_out_as_one_frame() -> None:
    x = torch.randn(3000)
    s = staging.stage(Int8Compressor(), x, pool=staging.PinnedPool(pin=False))
    frame = frame_parts(s.wire_parts())
    assert isinstance(frame, FrameParts) and len(frame) == len(encode_packet_bytes(s.packet()))
    assert decode_packet_bytes(frame.tobytes()) == s.packet()

    class Writer:
        def __init__(self) -> None:
            self.data = bytearray()

        def write(self, b: bytes | memoryview) -> None:
            self.data += b

        async def drain(self) -> None:
            return None

    w1, w2 = Writer(), Writer()
    n1 = asyncio.run(write_frame_drained(w1, frame))  # type: ignore[arg-type]
    n2 = asyncio.run(write_frame_drained(w2, frame.tobytes()))  # type: ignore[arg-type]
    assert n1 == n2 and bytes(w1.data) == bytes(w2.data)


# --- CUDA (run on a GPU machine with -k cuda) ----------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("n", [1, 63, 4099, 1 << 20, (1 << 22) + 77])
@pytest.mark.parametrize("name,make", CODECS, ids=[c[0] for c in CODECS])
def test_cuda_staged_packets_are_bit_identical_to_cpu(name: str, make, n: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 2
    x[:: max(1, n // 7)] = 0.0
    if n > 100:
        x[64:128] = 1e-40  # a tiny block (the 2**64 rescale)
    got = make("cuda").compress(x.cuda(), key="k")
    assert got == make().compress(x, key="k")


@needs_cuda
def test_cuda_half_inputs_are_bit_identical_to_cpu() -> None:
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(5000, generator=torch.Generator().manual_seed(5)).to(dtype)
        for _, make in CODECS:
            assert make("cuda").compress(x.cuda(), key="h") == make().compress(x, key="h")


@needs_cuda
def test_cuda_compress_many_pinned_pool_reuse_and_order() -> None:
    pool = staging.PinnedPool()
    x = torch.randn(1 << 21, device="cuda")
    items = [(x[a : a + (1 << 18)], f"v/{a}") for a in range(0, x.numel(), 1 << 18)]
    for _, make in CODECS:
        a, b = make("cuda"), make()
        staged = list(staging.compress_many(a, items, depth=3, pool=pool))
        assert [s.packet() for s in staged] == [b.compress(t.cpu(), key=k) for t, k in items]
        assert all(isinstance(v, memoryview) for s in staged for v in s.buffers)
        for s in staged:
            assert s._lease is not None and s._lease.is_pinned()
            s.release()
    assert pool.hits > 0 and pool.idle_bytes > 0


@needs_cuda
def test_cuda_staging_waits_for_work_on_the_current_stream() -> None:
    pool = staging.PinnedPool()
    x = torch.zeros(1 << 22, device="cuda")
    torch.cuda._sleep(50_000_000)  # a long kernel in front of the fill below, on the current stream
    x.fill_(1.5)
    s = staging.stage(Int8Compressor(device="cuda"), x, pool=pool)
    assert s.packet() == Int8Compressor().compress(torch.full((1 << 22,), 1.5))
    s.release()


@needs_cuda
def test_cuda_non_finite_input_is_refused() -> None:
    x = torch.ones(1000, device="cuda")
    x[5] = float("nan")
    for _, make in CODECS:
        with pytest.raises(UpdateRejected):
            make("cuda").compress(x)


@needs_cuda
@pytest.mark.parametrize("name,make", CODECS, ids=[c[0] for c in CODECS])
def test_cuda_decompress_through_pinned_is_bit_identical(name: str, make) -> None:
    for n in (77, 4099, (1 << 20) + 5):
        x = torch.randn(n, generator=torch.Generator().manual_seed(n))
        p = make().compress(x, key="d")
        on_gpu = make("cuda").decompress(p)
        assert on_gpu.is_cuda
        torch.testing.assert_close(on_gpu.cpu(), make().decompress(p), rtol=0, atol=0)
    pool = staging.default_pool()
    before = pool.hits
    make("cuda").decompress(p)
    assert pool.hits > before  # the upload buffer came back to the pool and served again
