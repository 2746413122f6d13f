"""`ci/stack_sampler.py`: the wall-clock sampler behind `ci/step_cost.py --sample`. What
it promises: each sample's weight is the time since the one before, so a function
that waits is charged its wait, and a function is counted once per sample however
deep it recurses; SIGALRM and the timer are the caller's again afterwards."""

from __future__ import annotations

import importlib.util
import signal
import sys
import time
from pathlib import Path

# In sys.modules only while it loads (its dataclass looks itself up there), so that its
# literals stay out of later tests' draws (tests/conftest.py).
_spec = importlib.util.spec_from_file_location("stack_sampler", Path(__file__).resolve().parents[2] / "ci" /
                                               "stack_sampler.py")
assert _spec is not None and _spec.loader is not None
_module = sys.modules["stack_sampler"] = importlib.util.module_from_spec(_spec)
try:
    _spec.loader.exec_module(_module)
finally:
    del sys.modules["stack_sampler"]
Samples, sampling = _module.Samples, _module.sampling


def test_samples_add_up_by_function_part_and_line_of_ours():
    inner, outer, library = ("ours.py", "inner", 10, 12), ("ours.py", "outer", 1, 3), ("lib.py", "call", 5, 6)
    samples = Samples(stacks=[(library, inner, outer), (inner, inner, outer), (outer,)], seconds=[0.5, 0.25, 2.0])
    assert samples.inclusive() == {("lib.py", "call", 5): 0.5, ("ours.py", "inner", 10): 0.75,
                                   ("ours.py", "outer", 1): 2.75}  # recursion counted once a sample
    assert samples.own(lambda frame: frame[0]) == {"lib.py": 0.5, "ours.py": 2.25}
    # The library's time goes to the line of ours that called it.
    assert samples.lines(lambda frame: frame[0] == "ours.py") == {inner: 0.75, outer: 2.0}


def waits(seconds: float) -> None:
    time.sleep(seconds)


def spins(samples: Samples, count: int) -> None:
    while len(samples.stacks) < count:
        sum(range(100))


def test_a_wait_is_charged_to_the_function_that_waits():
    before = signal.getsignal(signal.SIGALRM)
    with sampling() as samples:
        spins(samples, 20)
        waits(0.2)
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert len(samples.stacks) == len(samples.seconds) > 20
    charged = {name: sum(seconds for (_, function, _), seconds in samples.inclusive().items() if function == name)
               for name in ("spins", "waits")}
    assert charged["spins"] > 0
    assert charged["waits"] > 0.1  # of its 0.2 s: the samples landing in the sleep carry it
    here = samples.inclusive()[(__file__, "test_a_wait_is_charged_to_the_function_that_waits",
                                test_a_wait_is_charged_to_the_function_that_waits.__code__.co_firstlineno)]
    assert here >= charged["spins"] + charged["waits"] - 1e-9  # the caller is on every stack
