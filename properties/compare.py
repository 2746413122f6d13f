"""The failure object, and the bit-for-bit array comparison every check builds on.

A `Discrepancy` is structured: what was compared (`part`, and the `group` and `rank`
whose state it is, where there are several), the message, and the first differing
element (`index`, `expected`, `actual`). The rooms that compare their own state add
the element decoded in their terms (slot/compare.py, kv/compare.py,
lockstep/check.py). Reports (report/) read these fields; nothing reads the text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class Discrepancy(AssertionError):
    """The implementation disagrees with the reference (or with the contract)."""

    def __init__(self, part: str, message: str, *, group: int | None = None, rank: int | None = None,
                 index: tuple[int, ...] | None = None, expected: Any = None, actual: Any = None) -> None:
        super().__init__(part, message)
        self.part = part
        self.message = message
        self.group = group
        self.rank = rank
        self.index = index
        self.expected = expected
        self.actual = actual
        self.notes: list[str] = []  # what the harness learnt after the comparison (say, "never written")
        self.detail: Any = None  # the differing element in the compared state's own terms (lockstep/check.py)

    @property
    def what(self) -> str:
        """The compared state, as reports and case files name it: "group 0 rank 1 slot mapping"."""
        group = f"group {self.group} " if self.group is not None else ""
        rank = f"rank {self.rank} " if self.rank is not None else ""
        return f"{group}{rank}{self.part}"

    def __str__(self) -> str:
        return f"{self.what}: {self.message}" + "".join(f" ({note})" for note in self.notes)


def same_values(expected: np.ndarray, actual: np.ndarray) -> bool:
    """Two arrays of one shape and dtype hold the same values. For integers and
    booleans (all the harness compares) equal values are equal bytes, and comparing
    the bytes costs a tenth of np.array_equal on the small arrays of a step, which
    makes a few dozen such comparisons."""
    if expected.dtype.kind in "biu":
        return expected.tobytes() == actual.tobytes()
    return bool(np.array_equal(expected, actual))


def assert_arrays_equal(part: str, expected: np.ndarray, actual: np.ndarray, *, group: int | None = None,
                        rank: int | None = None, detail: Callable[[tuple[int, ...]], Any] | None = None) -> None:
    """Same shape, same dtype, same values everywhere (padding and tails included).
    `detail(index)`: the first differing element in the caller's terms, kept on the
    error. Every difference of values is raised from one place, so that Hypothesis,
    which tells failures apart by where they are raised, treats them as one."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        raise Discrepancy(part, f"shape {actual.shape}, expected {expected.shape}", group=group, rank=rank)
    if expected.dtype != actual.dtype:
        raise Discrepancy(part, f"dtype {actual.dtype}, expected {expected.dtype}", group=group, rank=rank)
    if not same_values(expected, actual):
        differ = np.argwhere(expected != actual)
        index = tuple(int(i) for i in differ[0])
        error = Discrepancy(part, f"{len(differ)} elements differ; first at {list(index)}: "
                                  f"expected {expected[index]}, got {actual[index]}",
                            group=group, rank=rank, index=index, expected=expected[index].item(),
                            actual=actual[index].item())
        error.detail = detail(index) if detail is not None else None
        raise error


def raised(part: str, error: Exception, group: int | None = None, rank: int | None = None) -> Discrepancy:
    """What the implementation raised, as a discrepancy that keeps it as its cause, so
    that the report can show where in the plug-in's code it was raised."""
    discrepancy = Discrepancy(part, f"the kernel raised {type(error).__name__}: {error}", group=group, rank=rank)
    discrepancy.__cause__ = error
    return discrepancy
