"""Run metrics: one JSON object per line (JSONL), mirrored to TensorBoard when it is installed."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["MetricsWriter"]

logger = logging.getLogger(__name__)


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


class MetricsWriter:
    """Appends records to ``<out_dir>/<filename>`` (and TensorBoard scalars if available).

    Each record is a flat mapping with at least ``kind`` (``train``, ``eval``, ``sync``, ...) and
    ``step``; a wall-clock ``time`` is added. Appending lets a resumed run continue the same file.

    Args:
        out_dir: run folder (created).
        filename: the JSONL file's name (peers sharing a folder use one each).
        tensorboard: mirror numeric fields to ``<out_dir>/tb`` when ``torch.utils.tensorboard`` imports.
    """

    def __init__(
        self, out_dir: str | Path, *, filename: str = "metrics.jsonl", tensorboard: bool = True
    ) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / filename
        self._f = self.path.open("a", encoding="utf-8")
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.dir / "tb" / Path(filename).stem))
            except ImportError:
                self._tb = None

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (numbers, strings, bools, None)."""
        rec = {k: _clean(v) for k, v in record.items()}
        rec.setdefault("time", time.time())
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        if self._tb is not None:
            kind, step = rec.get("kind", "train"), int(rec.get("step", 0))
            for k, v in rec.items():
                if isinstance(v, int | float) and not isinstance(v, bool) and k not in ("step", "time"):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)

    def flush(self) -> None:
        """Push buffered lines to disk."""
        self._f.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        """Flush and close (idempotent)."""
        if not self._f.closed:
            self._f.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
