"""Where a process's wall time goes, by sampling: a thread looks at the main thread's
Python stack every `interval` seconds and counts each function once per sample in
which it is on the stack. Unlike cProfile it adds nothing to each call, so pure
Python (Hypothesis's engine, our lockstep) is not inflated against native calls; a
native call (a torch operation, a wait for the device) is charged to the Python
function that made it. `ci/step_cost.py --sample N` uses it.
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

Frame = tuple[str, str, int]  # (file, function, first line)


@dataclass
class Samples:
    """Each sample's stack, innermost frame first."""

    stacks: list[tuple[Frame, ...]] = field(default_factory=list)

    def inclusive(self) -> collections.Counter[Frame]:
        """Per function, the samples with it anywhere on the stack (once each)."""
        counts: collections.Counter[Frame] = collections.Counter()
        for stack in self.stacks:
            counts.update(set(stack))
        return counts

    def own(self, part: Callable[[Frame], str]) -> collections.Counter[str]:
        """Per part, the samples whose innermost frame belongs to it."""
        return collections.Counter(part(stack[0]) for stack in self.stacks if stack)


def _stack(frame: object) -> tuple[Frame, ...]:
    frames = []
    while frame is not None:
        code = frame.f_code  # type: ignore[attr-defined]
        frames.append((code.co_filename, code.co_name, code.co_firstlineno))
        frame = frame.f_back  # type: ignore[attr-defined]
    return tuple(frames)


@contextmanager
def sampling(interval: float = 0.0005) -> Iterator[Samples]:
    """Sample the calling thread's stack while the block runs. The interpreter's switch
    interval is lowered meanwhile so that the sampler gets the GIL on time."""
    samples, target, stop = Samples(), threading.get_ident(), threading.Event()

    def sample() -> None:
        while not stop.wait(interval):
            frame = sys._current_frames().get(target)
            if frame is not None:
                samples.stacks.append(_stack(frame))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    thread = threading.Thread(target=sample, name="stack sampler", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)
