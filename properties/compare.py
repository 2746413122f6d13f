"""The failure object, and the bit-for-bit array comparison every check builds on.

A `Discrepancy` is structured: what was compared (`part`, and the `group` and `rank`
whose state it is, where there are several), the message, and the first differing
element (`index`, `expected`, `actual`). The rooms that compare their own state add
the element decoded in their terms (slot/compare.py, kv/compare.py,
lockstep/check.py). Reports (report/) read these fields; nothing reads the text.

`Handed` holds the tensors a kernel under test was handed, as it was handed them. A
kernel writes its outputs in place; one that resizes, re-strides or re-points a
tensor (`slot_mapping.resize_(2)`, `out_key.set_(...)`) leaves the harness reading
something other than what the contract says it wrote: fewer elements, bytes under
another dtype, or memory the kernel never touched, and the read-back then fails on
the harness's side (or passes on the bytes it still finds there). So every call site
snapshots the tensors before the call and checks them right after it, before
anything reads them, and a change is the kernel's finding, named as such.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from blocktable.plugin.contract import Contract


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


# -- the tensors a kernel was handed ---------------------------------------------------


class Layout(NamedTuple):
    """How a tensor sits in memory: what the harness reads it by. (A named tuple: a
    step takes two of these for every tensor each kernel call is handed, and a tuple
    is made in a third of a frozen dataclass's time.)"""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    offset: int  # the storage offset, in elements
    address: int  # the storage's first byte (resizing a storage moves it)


_make = tuple.__new__  # a named tuple's own __new__ is Python: this skips it (a third of layout's time)


def layout(tensor: torch.Tensor) -> Layout:
    # The shape stays a torch.Size: a tuple, compared as one, and made anew on each read.
    return _make(Layout, (tensor.shape, tensor.stride(), tensor.dtype, tensor.device, tensor.storage_offset(),
                          tensor.untyped_storage().data_ptr()))


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def change(before: Layout, after: Layout) -> str | None:
    """What changed from `before` to `after`, in the words a report uses ("the shape
    ... from (7,) to (2,)"), the most visible change first; None if nothing did."""
    if before.shape != after.shape:
        return f"the shape of {{}} from {tuple(before.shape)} to {tuple(after.shape)}"
    if before.dtype != after.dtype:
        return f"the dtype of {{}} from {_dtype(before.dtype)} to {_dtype(after.dtype)}"
    if before.stride != after.stride:
        return f"the strides of {{}} from {before.stride} to {after.stride}"
    if before.device != after.device:
        return f"the device of {{}} from {before.device} to {after.device}"
    if before.address != after.address or before.offset != after.offset:
        return "the memory of {}: it no longer views the buffer it was handed"
    return None


class Handed:
    """The tensors of one kernel call, by argument name (a list argument's tensors as
    `name[i]`), each marked as an output or an input."""

    def __init__(self, tensors: Iterable[tuple[str, torch.Tensor, bool]] = (), noun: str = "kernel") -> None:
        self.noun = noun  # how the message names the kernel: "kernel", "kv-gather kernel"
        self.tensors: list[tuple[str, torch.Tensor, bool, Layout]] = []
        for name, tensor, output in tensors:
            self.add(name, tensor, output)

    def add(self, name: str, tensor: torch.Tensor, output: bool) -> torch.Tensor:
        """Keep `tensor` as it is now, before the kernel gets it; returns it."""
        self.tensors.append((name, tensor, output, layout(tensor)))
        return tensor

    @classmethod
    def of(cls, contract: Contract, args: Sequence[Any]) -> Handed:
        """The tensor arguments of a call of `contract`'s kind, by their contract names."""
        found = []
        for name, value in zip(contract.positional, args):
            output = name in contract.outputs
            if isinstance(value, torch.Tensor):
                found.append((name, value, output))
            elif isinstance(value, (list, tuple)):
                found += [(f"{name}[{i}]", t, output) for i, t in enumerate(value) if isinstance(t, torch.Tensor)]
        return cls(found, contract.noun)

    def changed(self) -> str | None:
        """The first tensor the kernel changed, in words, or None."""
        for name, tensor, output, before in self.tensors:
            what = change(before, layout(tensor))
            if what is not None:
                role = "output" if output else "input"
                return f"the {self.noun} changed {what.format(f'its {role} {name}')}"
        return None

    def check(self, part: str, group: int | None = None, rank: int | None = None) -> None:
        """Raise the change as the kernel's Discrepancy, if it made one."""
        message = self.changed()
        if message is not None:
            raise Discrepancy(part, message, group=group, rank=rank)
