"""How a run's progress shows. On a terminal, rich's live bars, redrawn in place. In
a log (stdout a pipe or a file: CI), a live display shows nothing until the run
ends, so a 90-minute nightly would look dead for 90 minutes: there a plain line
every few seconds says what the run has done so far instead.

`bars()` gives the one that fits stdout; both take tasks and their updates the same
way. A task added with `logged=False` (each worker's line beside the total) shows
on a terminal only."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

SECONDS_VARIABLE = "BLOCKTABLE_PROGRESS_SECONDS"
DEFAULT_SECONDS = 30.0  # between two lines in a log


def interval() -> float:
    """Seconds between two progress lines in a log; ValueError names a bad setting."""
    text = os.environ.get(SECONDS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not (seconds > 0 and seconds < float("inf")):
        raise ValueError(f"{SECONDS_VARIABLE}={text!r}: must be a number of seconds > 0")
    return seconds


def clock_text(seconds: float) -> str:
    """0:01:05, as rich's elapsed column shows it."""
    whole = int(max(seconds, 0))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class Bars(Protocol):
    def add(self, name: str, total: float | None, logged: bool = True) -> Any: ...

    def update(self, task: Any, completed: float | None, detail: str, event: bool = False) -> None: ...

    def stop(self) -> None: ...


class LiveBars:
    """rich's bars, a line per task, redrawn in place."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console)
        self._progress.start()

    def add(self, name: str, total: float | None, logged: bool = True) -> Any:
        return self._progress.add_task(name, total=total, detail="starting")

    def update(self, task: Any, completed: float | None, detail: str, event: bool = False) -> None:
        self._progress.update(task, completed=completed, detail=detail)

    def stop(self) -> None:
        self._progress.stop()


@dataclass
class _Task:
    name: str
    logged: bool
    detail: str = "starting"


class PlainLines:
    """A line per logged task when it is first updated, then at most one every
    `every` seconds: `NAME: DETAIL; 0:01:05 elapsed`; and one for every update that
    is an `event` (a mutant's verdict: a log should hold each)."""

    def __init__(self, print_line: Callable[[str], None], every: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._print, self._every, self._clock = print_line, every, clock
        self._start = clock()
        self._tasks: list[_Task] = []
        self._last: dict[int, float] = {}

    def add(self, name: str, total: float | None, logged: bool = True) -> int:
        self._tasks.append(_Task(name, logged))
        return len(self._tasks) - 1

    def update(self, task: int, completed: float | None, detail: str, event: bool = False) -> None:
        entry = self._tasks[task]
        entry.detail = detail
        now = self._clock()
        if not entry.logged or (not event and now - self._last.get(task, -float("inf")) < self._every):
            return
        self._last[task] = now
        self._print(f"{entry.name}: {detail}; {clock_text(now - self._start)} elapsed")

    def stop(self) -> None:
        pass  # the summary that follows says where the run ended


def bars(console: Console) -> Bars:
    """Live bars on a terminal, plain lines in a log."""
    if console.is_terminal:
        return LiveBars(console)
    return PlainLines(lambda text: console.print(text, markup=False, soft_wrap=True, highlight=False), interval())
