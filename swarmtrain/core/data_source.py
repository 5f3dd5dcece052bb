"""Which data a config names: the source its ``paths`` imply, and a stale source from a lower layer.

Kept apart from ``swarmtrain.core.config`` (which uses both) so that file stays one concept: the
models and their loading.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

__all__ = ["is_token_path", "infer_data_source", "drop_stale_source"]


def is_token_path(path: str) -> bool:
    """Whether ``path`` names uint16 token data: a ``.bin`` file or a folder holding ``train.bin``."""
    return path.endswith(".bin") or (Path(path).expanduser() / "train.bin").is_file()


def infer_data_source(paths: list[str]) -> Literal["text", "bin"]:
    """The ``data.source`` that ``paths`` imply: ``bin`` when all are token data, ``text`` when none are.

    Raises:
        ValueError: a mix of token files and text (one line).
    """
    is_bin = [is_token_path(p) for p in paths]
    if any(is_bin) and not all(is_bin):
        raise ValueError("cannot mix .bin token files with text files in one run")
    return "bin" if is_bin and all(is_bin) else "text"


def drop_stale_source(layers: list[tuple[str, Mapping[str, Any]]], data: dict[str, Any]) -> None:
    """A ``data.source`` from a layer below the one that set ``data.paths`` described other paths:
    drop it, so the source is inferred from the paths (``--data x.txt`` over a stdlib checkpoint)."""

    def top(key: str) -> int:
        hits = [i for i, (_, layer) in enumerate(layers) if key in dict(layer.get("data") or {})]
        return hits[-1] if hits else -1

    if top("paths") > top("source") and isinstance(data.get("data"), dict):
        data["data"].pop("source", None)
