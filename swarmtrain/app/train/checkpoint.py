"""Checkpoints as safetensors (every tensor) plus JSON (everything else); no pickle anywhere.

A checkpoint is a folder holding ``tensors.safetensors`` and ``meta.json``. Any nested state
(``optimizer.state_dict()``, a strategy's ``state_dict()``, RNG states) is split by
:func:`pack_state` into flat named tensors and a JSON tree in which each tensor is replaced by a
reference ``{"__tensor__": name}``; tuples and dicts with non-string keys are tagged so they come
back as they were. :func:`unpack_state` reverses it. The same pair serves a newcomer's state
download, since neither side ever unpickles bytes.

Writes are atomic per file and ``meta.json`` is written last, so a folder with ``meta.json`` is a
complete checkpoint even if the writer was killed mid-save.
"""

from __future__ import annotations

import json
import math
import os
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from swarmtrain.core.errors import SwarmError

__all__ = [
    "CheckpointError",
    "pack_state",
    "unpack_state",
    "write_checkpoint",
    "read_checkpoint",
    "read_meta",
    "rng_state",
    "set_rng_state",
    "FORMAT_VERSION",
]

FORMAT_VERSION = 1
_TENSORS = "tensors.safetensors"
_META = "meta.json"
_TAGS = ("__tensor__", "__tuple__", "__map__", "__float__")
_MAX_META_BYTES = 64 << 20


class CheckpointError(SwarmError):
    """A checkpoint is missing, malformed, or does not fit the model/optimizer it is loaded into."""


#: the deepest nesting :func:`unpack_state` accepts (optimizer and strategy states nest a few levels)
MAX_DEPTH = 32


def pack_state(tree: Any, prefix: str = "") -> tuple[dict[str, torch.Tensor], Any]:
    """Split ``tree`` into named CPU tensors and a JSON-serialisable skeleton.

    Args:
        tree: nested dicts/lists/tuples of tensors, numbers, strings, bools and ``None``.
        prefix: name prefix of the tensors (e.g. ``"optimizer"``).

    Returns:
        ``(tensors, skeleton)``; ``unpack_state(skeleton, tensors)`` rebuilds ``tree``.

    Raises:
        CheckpointError: an unsupported value type.
    """
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()

    def enc(obj: Any, path: str) -> Any:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().to("cpu").contiguous()
            if t.numel() and t.untyped_storage().data_ptr() in seen:
                t = t.clone()  # safetensors refuses two names on one storage
            if t.numel():
                seen.add(t.untyped_storage().data_ptr())
            tensors[path] = t
            return {"__tensor__": path}
        if isinstance(obj, bool) or obj is None or isinstance(obj, str | int):
            return obj
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else {"__float__": repr(obj)}
        if isinstance(obj, np.generic):
            return enc(obj.item(), path)
        if isinstance(obj, tuple):
            return {"__tuple__": [enc(v, f"{path}.{i}") for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [enc(v, f"{path}.{i}") for i, v in enumerate(obj)]
        if isinstance(obj, Mapping):
            if all(isinstance(k, str) for k in obj) and not any(k in _TAGS for k in obj):
                return {k: enc(v, f"{path}.{k}") for k, v in obj.items()}
            items = []
            for k, v in obj.items():
                if not isinstance(k, str | int | bool) and k is not None:
                    raise CheckpointError(f"state key {k!r} at {path or '<root>'} is not a str or int")
                items.append([k, enc(v, f"{path}.{k}")])
            return {"__map__": items}
        raise CheckpointError(f"cannot store {type(obj).__name__} at {path or '<root>'} in a checkpoint")

    skeleton = enc(tree, prefix)
    return tensors, skeleton


def unpack_state(skeleton: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Rebuild the tree packed by :func:`pack_state`.

    Raises:
        CheckpointError: a reference to a missing tensor, a malformed skeleton, or one nested deeper
            than :data:`MAX_DEPTH` (a skeleton can come from a peer; no state of ours nests that deep).
    """

    def dec(obj: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise CheckpointError(f"checkpoint state nests deeper than {MAX_DEPTH} levels")
        if isinstance(obj, list):
            return [dec(v, depth + 1) for v in obj]
        if not isinstance(obj, dict):
            return obj
        if len(obj) == 1:
            ((tag, val),) = obj.items()
            if tag == "__tensor__":
                if not isinstance(val, str) or val not in tensors:
                    raise CheckpointError(f"checkpoint refers to a missing tensor {val!r}")
                return tensors[val]
            if tag == "__tuple__" and isinstance(val, list):
                return tuple(dec(v, depth + 1) for v in val)
            if tag == "__float__" and val in ("nan", "inf", "-inf"):
                return float(val)
            if tag == "__map__" and isinstance(val, list):
                out: dict[Any, Any] = {}
                for item in val:
                    if not isinstance(item, list) or len(item) != 2:
                        raise CheckpointError("checkpoint has a malformed mapping entry")
                    if not isinstance(item[0], str | int | bool) and item[0] is not None:
                        raise CheckpointError(f"checkpoint has a {type(item[0]).__name__} mapping key")
                    out[item[0]] = dec(item[1], depth + 1)
                return out
        return {k: dec(v, depth + 1) for k, v in obj.items()}

    return dec(skeleton, 0)


def _atomic(path: Path, write: Any) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_checkpoint(directory: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write ``state`` (a nested tree with tensors) into the folder ``directory``.

    Returns:
        The folder path.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if (d / _META).exists():  # the old meta goes first: a half-written folder never looks complete
        (d / _META).unlink()
    tensors, skeleton = pack_state(dict(state))
    _atomic(d / _TENSORS, lambda p: save_file(tensors, p, metadata={"format": str(FORMAT_VERSION)}))
    meta = {"format": FORMAT_VERSION, "state": skeleton}

    def write_meta(p: str) -> None:
        with open(p, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)

    _atomic(d / _META, write_meta)
    return d


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON part of a checkpoint (tensors left as ``{"__tensor__": name}`` references).

    Cheap: reads no tensor data; the CLI uses it to recover a run's config before building a model.

    Raises:
        CheckpointError: missing or malformed ``meta.json``.
    """
    meta_p = Path(directory) / _META
    if not meta_p.is_file():
        raise CheckpointError(f"{directory} is not a checkpoint (no {_META})")
    if meta_p.stat().st_size > _MAX_META_BYTES:
        raise CheckpointError(f"{meta_p} is implausibly large")
    try:
        meta = json.loads(meta_p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{meta_p} is not valid JSON: {e}") from None
    if (
        not isinstance(meta, dict)
        or meta.get("format") != FORMAT_VERSION
        or not isinstance(meta.get("state"), dict)
    ):
        raise CheckpointError(f"{meta_p}: unsupported checkpoint format")
    return meta["state"]


def read_checkpoint(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a folder written by :func:`write_checkpoint` (tensors on CPU).

    Raises:
        CheckpointError: missing files, a newer format, or malformed contents.
    """
    d = Path(directory)
    tens_p = d / _TENSORS
    skeleton = read_meta(d)
    if not tens_p.is_file():
        raise CheckpointError(f"{d} is not a complete checkpoint (no {_TENSORS})")
    try:
        tensors = load_file(str(tens_p), device="cpu")
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise CheckpointError(f"{tens_p} cannot be read: {e}") from None
    state = unpack_state(skeleton, tensors)
    if not isinstance(state, dict):  # pragma: no cover - read_meta checked the skeleton
        raise CheckpointError(f"{d}: the state is not a mapping")
    return state


def rng_state() -> dict[str, Any]:
    """Every RNG the training loop may touch: Python, NumPy, torch CPU and CUDA."""
    np_state: tuple[Any, ...] = tuple(np.random.get_state(legacy=True))
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(np.asarray(np_state[1], dtype=np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (CUDA only when present on both sides).

    Raises:
        CheckpointError: the state is malformed.
    """
    try:
        py = state["python"]
        random.setstate((int(py[0]), tuple(int(x) for x in py[1]), py[2]))
        n = state["numpy"]
        keys = n["keys"].numpy().astype(np.uint32)
        np.random.set_state(
            ("MT19937", keys, int(n["pos"]), int(n["has_gauss"]), float(n["cached_gaussian"]))
        )
        torch.set_rng_state(state["torch"].to(torch.uint8))
        if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([t.to(torch.uint8) for t in state["cuda"]])
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as e:
        raise CheckpointError(f"checkpoint RNG state is malformed: {e}") from None
