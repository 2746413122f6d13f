"""Bit-for-bit comparisons between the reference and the implementation, each
failing with a message that names the first differing element in domain terms."""

from __future__ import annotations

from typing import Any

import numpy as np


class Discrepancy(AssertionError):
    """The implementation disagrees with the reference. `what` names the compared
    state; `index` is the first differing element, `expected`/`actual` its values."""

    def __init__(self, what: str, message: str, index: tuple[int, ...] | None = None,
                 expected: Any = None, actual: Any = None) -> None:
        super().__init__(f"{what}: {message}")
        self.what = what
        self.index = index
        self.expected = expected
        self.actual = actual


def same_values(expected: np.ndarray, actual: np.ndarray) -> bool:
    """Two arrays of one shape and dtype hold the same values. For integers and
    booleans (all the harness compares) equal values are equal bytes, and comparing
    the bytes costs a tenth of np.array_equal on the small arrays of a step, which
    makes a few dozen such comparisons."""
    if expected.dtype.kind in "biu":
        return expected.tobytes() == actual.tobytes()
    return bool(np.array_equal(expected, actual))


def assert_arrays_equal(what: str, expected: np.ndarray, actual: np.ndarray) -> None:
    """Same shape, same dtype, same values everywhere (padding and tails included)."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        raise Discrepancy(what, f"shape {actual.shape}, expected {expected.shape}")
    if expected.dtype != actual.dtype:
        raise Discrepancy(what, f"dtype {actual.dtype}, expected {expected.dtype}")
    if not same_values(expected, actual):
        differ = np.argwhere(expected != actual)
        index = tuple(int(i) for i in differ[0])
        raise Discrepancy(what, f"{len(differ)} elements differ; first at {list(index)}: "
                                f"expected {expected[index]}, got {actual[index]}",
                          index, expected[index].item(), actual[index].item())


def assert_table_equal(what: str, reference: Any, implementation: Any, device_rows: np.ndarray | None = None) -> None:
    """One group's table: host rows, counts and the committed device copy (read back
    here unless the caller already has it)."""
    assert_arrays_equal(f"{what} host rows", reference.host, implementation.host)
    assert_arrays_equal(f"{what} row counts", reference.count, implementation.count)
    rows = implementation.device_rows() if device_rows is None else device_rows
    assert_arrays_equal(f"{what} device rows", reference.device, rows)


def assert_pool_equal(what: str, reference: Any, implementation: Any) -> None:
    """Ref counts and the free queue, in order."""
    assert_arrays_equal(f"{what} ref counts", np.asarray(reference.ref, dtype=np.int32), implementation.ref)
    ref_queue, impl_queue = reference.free_queue, implementation.free_queue()
    if ref_queue != impl_queue:
        first = next((i for i, (a, b) in enumerate(zip(ref_queue, impl_queue)) if a != b),
                     min(len(ref_queue), len(impl_queue)))
        raise Discrepancy(f"{what} free queue", f"differs from position {first}: expected "
                          f"{ref_queue[first:first + 8]}, got {impl_queue[first:first + 8]} "
                          f"(lengths {len(ref_queue)} and {len(impl_queue)})")


class SlotDiscrepancy(Discrepancy):
    """A slot mapping differs. Carries everything the report needs to decode the
    first differing element into request, position, block and rank."""

    def __init__(self, what: str, message: str, *, group: int, rank: int, config: dict[str, int],
                 query_start_loc: np.ndarray, positions: np.ndarray, table: np.ndarray,
                 expected: np.ndarray, actual: np.ndarray, requests: list[int | None]) -> None:
        super().__init__(what, message)
        self.group = group
        self.rank = rank
        self.config = config
        self.query_start_loc = query_start_loc
        self.positions = positions
        self.table = table.copy()  # a snapshot: the caller's table moves on with its run
        self.expected_mapping = expected
        self.actual_mapping = actual
        self.requests = requests


def check_slot_mapping(what: str, expected: np.ndarray, actual: np.ndarray, **context: Any) -> None:
    if expected.shape == actual.shape and expected.dtype == actual.dtype and same_values(expected, actual):
        return
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        message = f"shape/dtype {actual.shape} {actual.dtype}, expected {expected.shape} {expected.dtype}"
    else:
        differ = np.flatnonzero(expected != actual)
        t = int(differ[0])
        message = (f"{len(differ)} of {len(expected)} slots differ; first at token {t}: "
                   f"expected {expected[t]}, got {actual[t]}")
    raise SlotDiscrepancy(what, message, expected=expected, actual=actual, **context)
