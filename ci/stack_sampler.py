"""Where a process's wall time goes, by sampling: a wall-clock timer interrupts the main
thread every `interval` seconds and the signal handler records its Python stack,
weighted by the time since the previous sample. Unlike cProfile it adds nothing to
each call, so pure Python (Hypothesis's engine, our lockstep) is not inflated against
native calls. A native call (a torch operation, a wait for the device) defers the
handler until it returns, and the sample then carries the whole wait as its weight,
so a long call is neither lost nor counted once only. It lands where the interpreter
next looks for signals: a loop's jump back or the next call's start, which is mostly
in the function that made the native call, but may be the next function it calls, so
read the figures by function, not by line. `ci/step_cost.py --sample N` uses it.

A sampler thread would not do: it gets the GIL only where the sampled thread lets it
go, and torch lets it go in nearly every operation, so its samples pile up on the
lines that call torch.
"""

from __future__ import annotations

import collections
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

Frame = tuple[str, str, int, int]  # (file, function, its first line, the line running)


@dataclass
class Samples:
    """Each sample's stack (innermost frame first) and the wall time it stands for."""

    stacks: list[tuple[Frame, ...]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def inclusive(self) -> collections.Counter[tuple[str, str, int]]:
        """Per function (file, name, first line), the time of the samples with it
        anywhere on the stack (once each)."""
        total: collections.Counter[tuple[str, str, int]] = collections.Counter()
        for stack, seconds in zip(self.stacks, self.seconds):
            for function in {frame[:3] for frame in stack}:
                total[function] += seconds
        return total

    def own(self, part: Callable[[Frame], str]) -> collections.Counter[str]:
        """Per part, the time of the samples whose innermost frame belongs to it."""
        total: collections.Counter[str] = collections.Counter()
        for stack, seconds in zip(self.stacks, self.seconds):
            total[part(stack[0])] += seconds
        return total

    def lines(self, ours: Callable[[Frame], bool]) -> collections.Counter[Frame]:
        """Per line of our code, the time of the samples whose innermost frame of ours
        runs it: what a library or a native call costs is charged to the line that
        made it."""
        total: collections.Counter[Frame] = collections.Counter()
        for stack, seconds in zip(self.stacks, self.seconds):
            total[next((frame for frame in stack if ours(frame)), ("", "", 0, 0))] += seconds
        return total


def _stack(frame: FrameType | None) -> tuple[Frame, ...]:
    frames = []
    while frame is not None:
        code = frame.f_code
        frames.append((code.co_filename, code.co_name, code.co_firstlineno, frame.f_lineno))
        frame = frame.f_back
    return tuple(frames)


@contextmanager
def sampling(interval: float = 0.001) -> Iterator[Samples]:
    """Sample the main thread's stack while the block runs (call it from the main
    thread: only it receives signals). The handler's own time is left out of the
    weights. SIGALRM and the real-time timer are the caller's again afterwards."""
    samples = Samples()
    last = time.perf_counter()

    def sample(signum: int, frame: FrameType | None) -> None:
        nonlocal last
        now = time.perf_counter()
        if frame is not None:
            samples.stacks.append(_stack(frame))
            samples.seconds.append(now - last)
        last = time.perf_counter()

    previous = signal.signal(signal.SIGALRM, sample)
    signal.setitimer(signal.ITIMER_REAL, interval, interval)
    try:
        yield samples
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
