"""A rich progress bar for training runs: step, loss, tokens/s, elapsed and remaining time.

Shown only on an interactive terminal; elsewhere (CI, peer subprocesses, log files) it is a no-op
and the trainer's log lines carry the same information.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["TrainProgress"]


class TrainProgress:
    """Context manager around ``rich.progress.Progress``.

    Args:
        total: steps in the run.
        start: steps already done (a resumed run).
        enabled: ``False`` makes every method a no-op.
    """

    def __init__(self, total: int, start: int = 0, *, enabled: bool = True) -> None:
        console = Console(stderr=True)
        self.enabled = enabled and console.is_terminal
        self._progress: Progress | None = None
        self._task = TaskID(0)
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"),
                TextColumn("{task.fields[tps]} tok/s"),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=console,
                refresh_per_second=4,
            )
            self._task = self._progress.add_task("train", total=total, completed=start, loss="-", tps="-")

    def update(self, step: int, loss: float | None = None, tokens_per_s: float | None = None) -> None:
        """Move the bar to ``step`` (steps done) and refresh the shown figures when given."""
        if self._progress is None:
            return
        fields: dict[str, Any] = {}
        if loss is not None:
            fields["loss"] = f"{loss:.4f}"
        if tokens_per_s is not None:
            fields["tps"] = f"{tokens_per_s:,.0f}"
        self._progress.update(self._task, completed=step, **fields)

    def __enter__(self) -> TrainProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
