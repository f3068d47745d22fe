"""Progress of long command-line steps (export, verify, lint) on stderr.

Attached to a terminal, each step is a live `rich` progress bar; otherwise (CI logs, pipes,
files) each step prints one plain line when it passes a quarter of its total and when it
finishes, so a log shows progress without a line per item:

    weights read: 9/34 (26%)
    bytes written: 48.0/190.2 MiB (25%)

Use:
    with StepProgress() as progress:
        progress.update("weights read", done, total)
        progress.update("bytes written", nbytes, total_bytes, unit="bytes")
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import TracebackType
from typing import TextIO

__all__ = ["StepProgress"]

_QUARTERS = 4


def _amount(n: int, unit: str) -> str:
    return f"{n / 2**20:.1f}" if unit == "bytes" else str(n)


@dataclass
class _Plain:
    """Plain lines: one per quarter crossed and one at completion."""

    file: TextIO
    printed: dict[str, int] = field(default_factory=dict)  # step -> quarters printed

    def update(self, step: str, done: int, total: int, unit: str) -> None:
        quarters = _QUARTERS if done >= total else (done * _QUARTERS) // max(total, 1)
        if quarters <= self.printed.get(step, 0):
            return
        self.printed[step] = quarters
        suffix = " MiB" if unit == "bytes" else ""
        percent = 100 if done >= total else done * 100 // max(total, 1)
        print(f"{step}: {_amount(done, unit)}/{_amount(total, unit)}{suffix} ({percent}%)",
              file=self.file, flush=True)

    def close(self) -> None:
        pass


class _Rich:
    """rich bars, one per step, on the terminal."""

    def __init__(self, file: TextIO) -> None:
        # start-up time: rich takes a third of a second to import; only bars drawn on a
        # terminal need it
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(TextColumn("{task.description:<16}"), BarColumn(),
                                  TextColumn("{task.fields[amount]}"), TimeRemainingColumn(),
                                  console=Console(file=file))
        self._tasks: dict[str, int] = {}
        self._progress.start()

    def update(self, step: str, done: int, total: int, unit: str) -> None:
        suffix = " MiB" if unit == "bytes" else ""
        amount = f"{_amount(done, unit)}/{_amount(total, unit)}{suffix}"
        if step not in self._tasks:
            self._tasks[step] = self._progress.add_task(step, total=max(total, 1),
                                                        amount=amount)
        self._progress.update(self._tasks[step], completed=min(done, total),
                              total=max(total, 1), amount=amount)

    def close(self) -> None:
        self._progress.stop()


class StepProgress:
    """Progress display for the steps of one command.

    Args:
        file: where to draw (stderr by default).
        terminal: draw rich bars (True) or plain lines (False); default: whether `file` is
            a terminal.
    """

    def __init__(self, file: TextIO | None = None, terminal: bool | None = None) -> None:
        self._file = file if file is not None else sys.stderr
        if terminal is None:
            terminal = bool(getattr(self._file, "isatty", lambda: False)())
        self._view: _Plain | _Rich = _Rich(self._file) if terminal else _Plain(self._file)

    def update(self, step: str, done: int, total: int, unit: str = "") -> None:
        """Step `step` has done `done` of `total` (`unit` "bytes" shows MiB)."""
        self._view.update(step, int(done), int(total), unit)

    def close(self) -> None:
        self._view.close()

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
