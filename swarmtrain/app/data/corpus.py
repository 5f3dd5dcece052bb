"""Training corpora as flat token arrays: the Python stdlib sources, user text files, or uint16 ``.bin``.

Three sources (``DataConfig.source``):

* ``stdlib``: every ``.py`` file of the running interpreter's standard library (site-packages
  excluded), in sorted path order. Concatenating ~30 MB of small files is slow, so the result is
  cached once per machine under ``~/.cache/swarmtrain`` keyed by the Python version and a hash of
  the file list, and later processes memory-map the cache (four peers start in milliseconds).
* ``text``: files and folders the user names; bytes are the tokens.
* ``bin``: nanoGPT-style ``uint16`` token files (``train.bin``/``val.bin``), memory-mapped.

Train/val split: by a hash of each file's relative path, so the split never depends on the order or
the number of files; a single file (or a set whose hash split leaves one side empty) is split by its
tail instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swarmtrain.core.config import DataConfig
from swarmtrain.core.errors import ConfigError

__all__ = ["Corpus", "build_corpus", "stdlib_root", "default_cache_dir", "hash_split"]

logger = logging.getLogger(__name__)

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}
_CACHE_FORMAT = 1


@dataclass(frozen=True)
class Corpus:
    """Train and validation token streams.

    Attributes:
        train: 1-D ``uint8`` (bytes) or ``uint16`` (tokens) array, often a read-only memmap.
        val: same dtype as ``train``.
        vocab_size: token ids lie in ``[0, vocab_size)``.
        name: where it came from (for logs and checkpoint metadata).
        fingerprint: short hash identifying the exact contents' origin (file list and sizes).
    """

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    name: str
    fingerprint: str

    def __post_init__(self) -> None:
        if self.train.ndim != 1 or self.val.ndim != 1:
            raise ConfigError("corpus arrays must be 1-D")


def stdlib_root() -> Path:
    """The directory holding the running interpreter's standard library sources."""
    return Path(sysconfig.get_paths()["stdlib"])


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/swarmtrain`` or ``~/.cache/swarmtrain``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "swarmtrain"


def hash_split(rel_path: str, val_fraction: float) -> bool:
    """True when the file ``rel_path`` belongs to the validation split (a stable hash of the path)."""
    h = int.from_bytes(hashlib.sha256(rel_path.encode("utf-8")).digest()[:8], "big")
    return (h / 2**64) < val_fraction


def _walk(root: Path, suffix: str | None) -> list[Path]:
    out: list[Path] = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS and not x.startswith("."))
        for f in sorted(files):
            if f.startswith(".") or (suffix is not None and not f.endswith(suffix)):
                continue
            p = Path(d) / f
            if p.is_file():
                out.append(p)
    out.sort(key=lambda p: p.relative_to(root).as_posix())
    return out


def _split_files(files: Iterable[tuple[str, Path]], val_fraction: float) -> tuple[list[Path], list[Path]]:
    train: list[Path] = []
    val: list[Path] = []
    for rel, p in files:
        (val if hash_split(rel, val_fraction) else train).append(p)
    return train, val


def _concat(paths: Iterable[Path], cap: int | None = None, skip_binary: bool = False) -> bytes:
    chunks: list[bytes] = []
    total = 0
    for p in paths:
        try:
            b = p.read_bytes()
        except OSError as e:
            raise ConfigError(f"data: cannot read {p}: {e.strerror or e}") from None
        if skip_binary and b"\0" in b[:8192]:
            continue
        if cap is not None and total + len(b) > cap:
            b = b[: cap - total]
        chunks.append(b)
        total += len(b)
        if cap is not None and total >= cap:
            break
    return b"".join(chunks)


def _tail_split(data: np.ndarray, val_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    n_val = max(1, int(len(data) * val_fraction))
    return data[: len(data) - n_val], data[len(data) - n_val :]


def _cap(train: np.ndarray, val: np.ndarray, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """Apply ``max_bytes`` (counted in array elements): val keeps its fraction, train the rest."""
    if cfg.max_bytes is None or len(train) + len(val) <= cfg.max_bytes:
        return train, val
    n_val = min(len(val), max(int(cfg.max_bytes * cfg.val_fraction), 1))
    return train[: cfg.max_bytes - n_val], val[:n_val]


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _memmap(path: Path, dtype: type[np.generic]) -> np.ndarray:
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def build_stdlib_corpus(cfg: DataConfig, root: Path | None = None) -> Corpus:
    """The standard-library corpus, built once and memory-mapped from the cache afterwards.

    Args:
        cfg: data section (``val_fraction``, ``max_bytes``, ``cache_dir``).
        root: library root (tests pass a small tree); defaults to :func:`stdlib_root`.
    """
    root = root or stdlib_root()
    files = _walk(root, ".py")
    if not files:
        raise ConfigError(f"data: no .py files under {root}")
    listing = hashlib.sha256()
    rels: list[tuple[str, Path]] = []
    for p in files:
        rel = p.relative_to(root).as_posix()
        rels.append((rel, p))
        listing.update(f"{rel}\0{p.stat().st_size}\n".encode())
    listing.update(f"val={cfg.val_fraction!r} fmt={_CACHE_FORMAT}".encode())
    key = f"stdlib-py{sys.version_info[0]}{sys.version_info[1]}-{listing.hexdigest()[:16]}"
    cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
    train_p, val_p, meta_p = cache / f"{key}.train.bin", cache / f"{key}.val.bin", cache / f"{key}.json"
    if not meta_p.exists():
        train_files, val_files = _split_files(rels, cfg.val_fraction)
        train_b, val_b = _concat(train_files), _concat(val_files)
        try:
            _atomic_write(train_p, train_b)
            _atomic_write(val_p, val_b)
            meta = {"root": str(root), "files": len(files), "train": len(train_b), "val": len(val_b)}
            _atomic_write(meta_p, json.dumps(meta).encode())  # written last: marks a complete cache
            logger.info("cached stdlib corpus (%d files, %d bytes) at %s", len(files), len(train_b), cache)
        except OSError as e:  # read-only home: keep going from memory
            logger.warning("cannot cache the stdlib corpus in %s (%s); using it from memory", cache, e)
            train = np.frombuffer(train_b, dtype=np.uint8)
            val = np.frombuffer(val_b, dtype=np.uint8)
            train, val = _cap(train, val, cfg)
            return Corpus(train, val, 256, f"stdlib:{root}", key)
    train, val = _cap(_memmap(train_p, np.uint8), _memmap(val_p, np.uint8), cfg)
    return Corpus(train, val, 256, f"stdlib:{root}", key)


def build_text_corpus(cfg: DataConfig) -> Corpus:
    """Bytes of the named text files and folders (folders walked recursively; binary files skipped)."""
    if not cfg.paths:
        raise ConfigError("data.paths: source 'text' needs at least one file or folder")
    rels: list[tuple[str, Path]] = []
    listing = hashlib.sha256()
    for raw in cfg.paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            for f in _walk(p, None):
                rels.append((f"{p.name}/{f.relative_to(p).as_posix()}", f))
        elif p.is_file():
            rels.append((p.name, p))
        else:
            raise ConfigError(f"data.paths: {raw} does not exist")
    for rel, f in rels:
        listing.update(f"{rel}\0{f.stat().st_size}\n".encode())
    train_files, val_files = _split_files(rels, cfg.val_fraction)
    if train_files and val_files:
        train = np.frombuffer(_concat(train_files, cfg.max_bytes, skip_binary=True), dtype=np.uint8)
        val = np.frombuffer(_concat(val_files, cfg.max_bytes, skip_binary=True), dtype=np.uint8)
    else:
        allb = np.frombuffer(_concat((p for _, p in rels), cfg.max_bytes, skip_binary=True), dtype=np.uint8)
        train, val = _tail_split(allb, cfg.val_fraction)
    train, val = _cap(train, val, cfg)
    if len(train) == 0:
        raise ConfigError(f"data.paths: no text found in {', '.join(cfg.paths)}")
    return Corpus(train, val, 256, "text:" + ",".join(cfg.paths), listing.hexdigest()[:16])


def build_bin_corpus(cfg: DataConfig, vocab_size: int | None = None) -> Corpus:
    """Memory-mapped ``uint16`` token files.

    ``paths`` may name folders holding ``train.bin`` and ``val.bin`` (nanoGPT's layout) or files: a
    file named ``val.bin`` is validation data, the others are training data; with no validation file
    the tail of the training data is held out.
    """
    if not cfg.paths:
        raise ConfigError("data.paths: source 'bin' needs at least one .bin file or folder")
    train_files: list[Path] = []
    val_files: list[Path] = []
    for raw in cfg.paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            if not (p / "train.bin").is_file():
                raise ConfigError(f"data.paths: folder {raw} has no train.bin")
            train_files.append(p / "train.bin")
            if (p / "val.bin").is_file():
                val_files.append(p / "val.bin")
        elif p.is_file():
            (val_files if p.name == "val.bin" else train_files).append(p)
        else:
            raise ConfigError(f"data.paths: {raw} does not exist")
    for f in train_files + val_files:
        if f.stat().st_size % 2:
            raise ConfigError(f"data.paths: {f} has an odd size; expected uint16 tokens")
    if not train_files:
        raise ConfigError("data.paths: no training .bin file")

    def load(fs: list[Path]) -> np.ndarray:
        arrays = [_memmap(f, np.uint16) for f in fs]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    train = load(train_files)
    val = load(val_files) if val_files else None
    if val is None:
        train, val = _tail_split(train, cfg.val_fraction)
    train, val = _cap(train, val, cfg)
    if vocab_size is None:  # one pass over the tokens; pass model.vocab_size to skip it
        hi = 0
        for arr in (train, val):
            for i in range(0, len(arr), 1 << 26):
                hi = max(hi, int(arr[i : i + (1 << 26)].max()))
        vocab_size = hi + 1
    fp = hashlib.sha256(
        "".join(f"{f.resolve()}\0{f.stat().st_size}\n" for f in train_files + val_files).encode()
    ).hexdigest()[:16]
    return Corpus(train, val, vocab_size, "bin:" + ",".join(cfg.paths), fp)


def build_corpus(cfg: DataConfig, *, vocab_size: int | None = None) -> Corpus:
    """Load the corpus described by ``cfg``.

    Args:
        cfg: data section of the run config.
        vocab_size: for ``bin`` data, the model's vocab if known (skips scanning for the largest id).

    Raises:
        ConfigError: missing or unreadable paths, or an empty corpus.
    """
    if cfg.source == "stdlib":
        return build_stdlib_corpus(cfg)
    if cfg.source == "text":
        return build_text_corpus(cfg)
    return build_bin_corpus(cfg, vocab_size=vocab_size)
