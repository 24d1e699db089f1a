"""Progress while calibration runs: rich bars on a terminal, one log line per step otherwise."""

from __future__ import annotations

import logging
from typing import Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

log = logging.getLogger("exporter.calibrate")


class Reporter(Protocol):
    def begin(self, total: int) -> None: ...
    def started(self, title: str) -> None: ...
    def finished(self, title: str, outcome: str) -> None: ...
    def close(self) -> None: ...


class LogReporter:
    """A log line per finished step: for Jobs and pipes, where a bar would be noise."""

    def __init__(self) -> None:
        self._total = 0
        self._done = 0

    def begin(self, total: int) -> None:
        self._total = total
        log.info("calibration started", extra={"steps": total})

    def started(self, title: str) -> None:
        log.debug("measuring", extra={"step": f"{self._done + 1}/{self._total}", "what": title})

    def finished(self, title: str, outcome: str) -> None:
        self._done += 1
        log.info(
            "measured",
            extra={"step": f"{self._done}/{self._total}", "what": title, "result": outcome},
        )

    def close(self) -> None:
        """Nothing to tear down: every line is already written."""


class BarReporter:
    """A rich progress bar on the terminal, with each finished step printed above it."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )
        self._task = self._progress.add_task("calibrating", total=None)

    def begin(self, total: int) -> None:
        self._progress.update(self._task, total=total)
        self._progress.start()

    def started(self, title: str) -> None:
        self._progress.update(self._task, description=title)

    def finished(self, title: str, outcome: str) -> None:
        self._console.print(f"[bold]{title}[/bold]: {outcome}", highlight=False)
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.update(self._task, description="done")
        self._progress.stop()


def reporter_for(stream: TextIO) -> Reporter:
    """Bars when `stream` is a terminal, log lines otherwise."""
    if stream.isatty():
        return BarReporter(Console(file=stream))
    return LogReporter()
