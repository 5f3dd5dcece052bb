"""Corpora (stdlib cache, text, uint16 bins) and the per-peer sampler (disjoint, deterministic)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from swarmtrain.app.data import BatchSampler, build_corpus, eval_batches, hash_split
from swarmtrain.app.data.corpus import build_stdlib_corpus
from swarmtrain.core.config import DataConfig
from swarmtrain.core.errors import ConfigError


def _fake_stdlib(root: Path, n: int = 60) -> Path:
    for i in range(n):
        sub = root / ("pkg" if i % 3 else "") / f"mod{i}.py"
        sub.parent.mkdir(parents=True, exist_ok=True)
        sub.write_text(f"# module {i}\n" + "x = 1\n" * (i + 5))
    (root / "site-packages").mkdir()
    (root / "site-packages" / "third.py").write_text("THIRD PARTY\n")
    (root / "notes.txt").write_text("not python\n")
    return root


def test_stdlib_corpus_cached_and_deterministic(tmp_path: Path) -> None:
    root = _fake_stdlib(tmp_path / "lib")
    cfg = DataConfig(cache_dir=str(tmp_path / "cache"), val_fraction=0.2)
    a = build_stdlib_corpus(cfg, root)
    assert len(list((tmp_path / "cache").glob("*.bin"))) == 2
    b = build_stdlib_corpus(cfg, root)  # from the cache: a memmap with the same bytes
    assert isinstance(b.train, np.memmap)
    assert np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val)
    assert a.fingerprint == b.fingerprint
    everything = bytes(a.train) + bytes(a.val)
    assert b"THIRD PARTY" not in everything and b"not python" not in everything
    # the split is by path hash: val holds exactly the files whose path hashes below the fraction
    val_files = sorted(
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and hash_split(p.relative_to(root).as_posix(), 0.2)
    )
    assert 0 < len(val_files) < 60
    assert bytes(a.val) == b"".join(
        p.read_bytes() for p in sorted(val_files, key=lambda p: p.relative_to(root).as_posix())
    )
    # max_bytes caps both streams
    capped = build_stdlib_corpus(
        DataConfig(cache_dir=str(tmp_path / "cache"), val_fraction=0.2, max_bytes=2000), root
    )
    assert len(capped.train) + len(capped.val) <= 2000 and len(capped.val) > 0


def test_real_stdlib_corpus_loads() -> None:
    c = build_corpus(DataConfig(max_bytes=1 << 20))
    assert c.train.dtype == np.uint8 and c.vocab_size == 256
    assert len(c.train) + len(c.val) == 1 << 20 and len(c.val) > 1000
    assert b"def " in bytes(c.train[:100_000])


def test_text_corpus_file_and_folder(tmp_path: Path) -> None:
    f = tmp_path / "one.txt"
    f.write_bytes(b"hello world\n" * 500)
    c = build_corpus(DataConfig(source="text", paths=[str(f)], val_fraction=0.1))
    assert len(c.val) == 600 and len(c.train) == 5400  # a single file: the tail is held out
    d = tmp_path / "dir"
    d.mkdir()
    for i in range(30):
        (d / f"f{i}.md").write_text(f"doc {i}\n" * 50)
    (d / "blob.bin").write_bytes(b"\0\1\2" * 100)
    c2 = build_corpus(DataConfig(source="text", paths=[str(d)], val_fraction=0.2))
    assert b"\0" not in bytes(c2.train) + bytes(c2.val)  # binary files skipped
    assert len(c2.val) > 0 and len(c2.train) > 0
    with pytest.raises(ConfigError, match="does not exist"):
        build_corpus(DataConfig(source="text", paths=[str(tmp_path / "nope")]))
    with pytest.raises(ConfigError, match="needs at least one"):
        build_corpus(DataConfig(source="text"))


def test_bin_corpus(tmp_path: Path) -> None:
    d = tmp_path / "owt"
    d.mkdir()
    np.arange(5000, dtype=np.uint16).tofile(d / "train.bin")
    (np.arange(300, dtype=np.uint16) + 7000).tofile(d / "val.bin")
    c = build_corpus(DataConfig(source="bin", paths=[str(d)]))
    assert c.train.dtype == np.uint16 and len(c.train) == 5000 and len(c.val) == 300
    assert c.vocab_size == 7300  # largest id + 1 when the model does not say
    assert build_corpus(DataConfig(source="bin", paths=[str(d)]), vocab_size=50304).vocab_size == 50304
    single = build_corpus(DataConfig(source="bin", paths=[str(d / "train.bin")], val_fraction=0.1))
    assert len(single.val) == 500
    (tmp_path / "odd.bin").write_bytes(b"abc")
    with pytest.raises(ConfigError, match="odd size"):
        build_corpus(DataConfig(source="bin", paths=[str(tmp_path / "odd.bin")]))
    s = BatchSampler(c.train, batch_size=2, block_size=8, vocab_size=100)
    with pytest.raises(ConfigError, match="outside the vocab"):
        for step in range(50):
            s.get(step)


def test_sampler_disjoint_across_peers_and_micro_batches() -> None:
    data = np.arange(100_000, dtype=np.int64) % 251
    peers = [
        BatchSampler(data, batch_size=4, block_size=16, seed=3, peer_index=i, num_peers=4, grad_accum=2)
        for i in range(4)
    ]
    per_epoch = peers[0].batches_per_epoch
    seen: set[int] = set()
    count = 0
    for step in range(per_epoch // 8):  # stay inside the first epoch
        for s in peers:
            for micro in range(2):
                starts = s.starts(step, micro)
                assert len(starts) == 4
                seen.update(int(x) for x in starts)
                count += 4
    assert len(seen) == count  # no window twice, whichever peer or micro-batch
    offs = sorted(seen)
    assert all(b - a >= 16 for a, b in zip(offs, offs[1:], strict=False))  # windows never overlap


def test_sampler_pure_function_of_position() -> None:
    data = np.frombuffer(bytes(range(256)) * 400, dtype=np.uint8)
    a = BatchSampler(data, batch_size=3, block_size=10, seed=5, peer_index=1, num_peers=2)
    b = BatchSampler(data, batch_size=3, block_size=10, seed=5, peer_index=1, num_peers=2)
    c = BatchSampler(data, batch_size=3, block_size=10, seed=6, peer_index=1, num_peers=2)
    late = a.get(5000)  # far into a later epoch, then back: no hidden state
    x0, y0 = a.get(0)
    xb, yb = b.get(0)
    assert torch.equal(x0, xb) and torch.equal(y0, yb)
    assert torch.equal(late[0], b.get(5000)[0])
    assert not torch.equal(c.get(0)[0], x0)
    assert x0.dtype == torch.int64 and x0.shape == (3, 10)
    assert torch.equal(x0[:, 1:], y0[:, :-1])  # targets are the next bytes
    assert torch.equal((x0 + 1) % 256, y0)  # the data is a byte ramp


def test_sampler_errors() -> None:
    with pytest.raises(ConfigError, match="too small"):
        BatchSampler(np.zeros(100, dtype=np.uint8), batch_size=8, block_size=16)
    with pytest.raises(ConfigError, match="peer_index"):
        BatchSampler(np.zeros(10_000, dtype=np.uint8), batch_size=1, block_size=8, peer_index=2, num_peers=2)


def test_eval_batches_fixed() -> None:
    data = np.arange(5000, dtype=np.int64) % 256
    a = eval_batches(data, n_batches=3, batch_size=4, block_size=32)
    b = eval_batches(data, n_batches=3, batch_size=4, block_size=32)
    assert len(a) == 3 and a[0][0].shape == (4, 32)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b, strict=True))
    with pytest.raises(ConfigError, match="shorter"):
        eval_batches(data[:10], n_batches=1, batch_size=1, block_size=32)
