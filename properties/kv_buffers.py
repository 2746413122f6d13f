"""One KV call (docs/contract.md §9) run behind guards and checked against the truth,
every buffer whole and bit for bit.

Every tensor a kernel is handed is a view into a flat buffer that has guard
elements before and after it, and often gaps inside it (a cache that is half of a
`[num_blocks, 2, ...]` tensor, a key that is a slice of a `[tokens, 3, H, D]` one, a
head dim padded past D). Before the call each flat buffer holds pseudo-random bits
(caches and outputs too, so that an element the kernel must leave alone is checked
as much as one it must write); index buffers (slots, block ids, cu_lens) hold valid
indices in their guards, so that a kernel reading past its input acts on them where
the output shows it. The expected buffers are the same flat buffers with the truth
(properties/kv_truth.py) applied through the same views on the host; after the call
each device buffer is brought back whole and must equal them, guards and gaps
included. A difference inside a cache or an output is decoded by
properties/kv_compare.py; one anywhere else names the buffer and its offset.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from blocktable.properties.compare import Discrepancy

# Host dtypes of the reference (bfloat16 as uint16 bits), and the integer types the
# flat buffers hold the same bits in (signed where torch has no unsigned type).
HOST = {"float16": np.float16, "bfloat16": np.uint16, "float32": np.float32, "uint8": np.uint8,
        "int32": np.int32, "int64": np.int64}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "uint8": torch.uint8,
         "int32": torch.int32, "int64": torch.int64}
_FLAT = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
MIN_GUARD = 64


def pseudo_random_bits(seed: int, salt: str, count: int) -> np.ndarray:
    """`count` uint64s of splitmix64 over (seed, salt): the same on every machine and
    numpy version, so a case file keeps a cache's contents as one seed."""
    with np.errstate(over="ignore"):
        x = (np.arange(count, dtype=np.uint64) + np.uint64((seed * 0x9E3779B1 + zlib.crc32(salt.encode()))
                                                            % 2**64) * np.uint64(0x9E3779B97F4A7C15))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


@dataclass
class Region:
    """A flat buffer of `guard` + prod(`outer`) + `guard` elements of `dtype`, and the
    tensors handed to the kernel as basic-index views of its `outer` middle."""

    name: str
    dtype: str
    outer: tuple[int, ...]
    guard: int
    views: dict[str, tuple] = field(default_factory=dict)  # tensor name -> index into the outer array
    output: bool = False  # the kernel's to write (through its views); else it must change nothing
    flat: np.ndarray | None = None  # before the call, as bits

    @property
    def size(self) -> int:
        return 2 * self.guard + math.prod(self.outer)

    def fill(self, seed: int, modulus: int | None = None) -> "Region":
        """Pseudo-random bits everywhere, or (`modulus`) valid indices below it."""
        raw = pseudo_random_bits(seed, self.name, self.size)
        itemsize = np.dtype(HOST[self.dtype]).itemsize
        flat_type = _FLAT[itemsize]
        if modulus is not None:
            self.flat = (raw % np.uint64(max(modulus, 1))).astype(flat_type)
        else:
            self.flat = raw.astype(np.dtype(f"u{itemsize}")).view(flat_type)
        return self

    def host(self, flat: np.ndarray, view: str) -> np.ndarray:
        """The view `view` of a host copy of the buffer, in the reference's dtype."""
        middle = flat[self.guard:self.guard + math.prod(self.outer)].reshape(self.outer)
        return middle[self.views[view]].view(HOST[self.dtype])

    def device(self, flat: torch.Tensor, view: str) -> torch.Tensor:
        middle = flat[self.guard:self.guard + math.prod(self.outer)].view(self.outer)
        return middle[self.views[view]].view(TORCH[self.dtype])

    def inside(self) -> np.ndarray:
        """Which flat elements some view covers."""
        mask = np.zeros(self.size, dtype=bool)
        middle = mask[self.guard:self.guard + math.prod(self.outer)].reshape(self.outer)
        for index in self.views.values():
            middle[index] = True
        return mask


@dataclass
class Checks:
    """How a call's outputs are compared: per (region, view), a function that raises
    Discrepancy for the expected and actual views (kv_compare with the call's
    decoding), in the order reports should meet them."""

    compare: list[tuple[str, str, Callable[[np.ndarray, np.ndarray], None]]] = field(default_factory=list)


def run_guarded(regions: list[Region], truth: Callable[[Callable[[str, str], np.ndarray]], None],
                call_kernel: Callable[[Callable[[str, str], torch.Tensor]], None], checks: Checks,
                device: torch.device, label: str) -> None:
    """Lay the regions out on the device, call the kernel with their views, bring every
    buffer back and compare it whole with the truth's. Raises Discrepancy."""
    by_name = {r.name: r for r in regions}
    expected = {r.name: r.flat.copy() for r in regions}
    truth(lambda region, view: by_name[region].host(expected[region], view))
    on_device = {r.name: torch.from_numpy(r.flat.copy()).to(device) for r in regions}
    call_kernel(lambda region, view: by_name[region].device(on_device[region], view))
    actual = {name: t.cpu().numpy() for name, t in on_device.items()}
    for region, view, compare in checks.compare:
        r = by_name[region]
        want, got = (np.ascontiguousarray(r.host(flat[region], view)) for flat in (expected, actual))
        try:
            compare(want, got)
        except Discrepancy as error:
            raise _unwritten(error, want, got, r.host(r.flat, view)) from None
    for r in regions:  # guards, gaps, inputs: whatever no check above covered
        changed = np.flatnonzero(expected[r.name] != actual[r.name])
        if not len(changed):
            continue
        inside = r.inside()
        where = "outside its tensors" if r.output else "into an input"
        first = int(changed[0])
        part = ("a view" if inside[first] else
                "the guard before it" if first < r.guard else
                "the guard after it" if first >= r.size - r.guard else "a gap between its views")
        raise Discrepancy(f"{label} {r.name} guard",
                          f"the kernel wrote {where}: {len(changed)} elements of the {r.name} buffer changed, "
                          f"the first at element {first - r.guard} of {math.prod(r.outer)} ({part}; "
                          f"{', '.join(r.views)} handed as views of a {list(r.outer)} {r.dtype} buffer)")


def _unwritten(error: Discrepancy, want: np.ndarray, got: np.ndarray, before: np.ndarray) -> Discrepancy:
    """The error, saying so when the first differing element still holds what it held
    before the call (the kernel never wrote it)."""
    as_bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
    differ = np.argwhere(want.view(as_bits) != got.view(as_bits))
    if not len(differ):
        return error
    first = tuple(differ[0])
    if got.view(as_bits)[first] != np.ascontiguousarray(before).view(as_bits)[first]:
        return error
    message = (str(error).removeprefix(f"{error.what}: ")
               + " (what it held before the call: the kernel did not write it)")
    amended = Discrepancy(error.what, message, error.index, error.expected, error.actual)
    amended.__dict__.update({k: v for k, v in error.__dict__.items() if k not in amended.__dict__})
    return amended


def raised(label: str, error: Exception) -> Discrepancy:
    """A kernel's exception as a discrepancy that keeps it as its cause, so that the
    report can show where in the plug-in's code it was raised."""
    discrepancy = Discrepancy(label, f"the kernel raised {type(error).__name__}: {error}")
    discrepancy.__cause__ = error
    return discrepancy
