"""One line naming what a run trains on, for the headers of ``train``, ``simulate`` and ``join``.

Built from the config and the file sizes alone (no corpus is read), so a peer says what it will
train on before the corpus loads, and a mistake (the stdlib when you meant your files) shows at once.
"""

from __future__ import annotations

from pathlib import Path

from swarmtrain.app.data.corpus import _walk
from swarmtrain.core.config import DataConfig

__all__ = ["describe_data"]

#: paths named in the line before "and N more"
_SHOWN = 2


def _files(cfg: DataConfig) -> tuple[list[Path], list[str]]:
    """The files ``cfg.paths`` name (folders walked as the corpus builders walk them), and the
    paths that do not exist."""
    files: list[Path] = []
    missing: list[str] = []
    for raw in cfg.paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            if cfg.source == "bin":
                files += [f for f in (p / "train.bin", p / "val.bin") if f.is_file()]
            else:
                files += _walk(p, None)
        elif p.is_file():
            files.append(p)
        else:
            missing.append(raw)
    return files, missing


def describe_data(cfg: DataConfig) -> str:
    """``data: text from notes/ (2 files, 1.2 MiB, val 2%)`` or
    ``data: Python standard library sources (built in, val 2%)``.

    Never raises for missing paths (the corpus builder reports those): they are listed instead.
    """
    from swarmtrain.app.units import human_bytes

    val = f"val {cfg.val_fraction * 100:g}%"
    cap = f", first {human_bytes(cfg.max_bytes)}" if cfg.max_bytes is not None else ""
    if cfg.source == "stdlib":
        return f"data: Python standard library sources (built in, {val}{cap})"
    files, missing = _files(cfg)
    names = ", ".join(cfg.paths[:_SHOWN]) + (
        f" and {len(cfg.paths) - _SHOWN} more" if len(cfg.paths) > _SHOWN else ""
    )
    size = human_bytes(sum(f.stat().st_size for f in files))
    what = "text"
    if cfg.source == "bin":
        what = "uint16 tokens"
        if any(f.name == "val.bin" for f in files):
            val = "val from val.bin"
    n = len(files)
    line = f"data: {what} from {names} ({n} file{'' if n == 1 else 's'}, {size}, {val}{cap})"
    return line + (f"; missing: {', '.join(missing)}" if missing else "")
