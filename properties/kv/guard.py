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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import torch

from blocktable.properties.compare import Discrepancy, Handed
from blocktable.properties.kv.data import HOST, SIGNED, TORCH, UNSIGNED, pseudo_random_bits

MIN_GUARD = 64


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

    def fill(self, seed: int, modulus: int | None = None) -> Region:
        """Pseudo-random bits everywhere, or (`modulus`) valid indices below it."""
        raw = pseudo_random_bits(seed, self.name, self.size)
        itemsize = np.dtype(HOST[self.dtype]).itemsize
        flat_type = SIGNED[itemsize]
        if modulus is not None:
            self.flat = (raw % np.uint64(max(modulus, 1))).astype(flat_type)
        else:
            self.flat = raw.astype(np.dtype(f"u{itemsize}")).view(flat_type)
        return self

    def bits(self) -> np.ndarray:
        """The buffer before the call (`fill` made it)."""
        if self.flat is None:
            raise ValueError(f"region {self.name} was never filled")
        return self.flat

    def host(self, flat: np.ndarray, view: str) -> np.ndarray:
        """The view `view` of a host copy of the buffer, in the reference's dtype."""
        middle = flat[self.guard:self.guard + math.prod(self.outer)].reshape(self.outer)
        return middle[self.views[view]].view(HOST[self.dtype])

    def device(self, flat: torch.Tensor, view: str) -> torch.Tensor:
        middle = flat[self.guard:self.guard + math.prod(self.outer)].view(self.outer)
        return middle[self.views[view]].view(TORCH[self.dtype])

    def inside(self, views: Iterable[str] | None = None) -> np.ndarray:
        """Which flat elements the views (all of them, or these) cover."""
        mask = np.zeros(self.size, dtype=bool)
        middle = mask[self.guard:self.guard + math.prod(self.outer)].reshape(self.outer)
        for name, index in self.views.items():
            if views is None or name in views:
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
                device: torch.device, label: str, kind: str = "kernel") -> None:
    """Lay the regions out on the device, call the kernel with their views, bring every
    buffer back and compare it whole with the truth's. Raises Discrepancy. `kind`:
    the kernel's flag ("kv-gather"), as reports name it."""
    by_name = {r.name: r for r in regions}
    expected = {r.name: r.bits().copy() for r in regions}
    truth(lambda region, view: by_name[region].host(expected[region], view))
    on_device = {r.name: torch.from_numpy(r.bits().copy()).to(device) for r in regions}
    handed = Handed(noun="kernel" if kind == "kernel" else f"{kind} kernel")
    call_kernel(lambda region, view: handed.add(argument_name(region, view),
                                                by_name[region].device(on_device[region], view),
                                                by_name[region].output))
    # Before anything is read. The read-back is of the whole buffers, which a kernel
    # that resized or re-pointed a tensor may have left holding the right bytes.
    handed.check(f"{label} {kind}")
    actual = {name: t.cpu().numpy() for name, t in on_device.items()}
    for region, view, compare in checks.compare:
        r = by_name[region]
        want, got = (np.ascontiguousarray(r.host(flat[region], view)) for flat in (expected, actual))
        try:
            compare(want, got)
        except Discrepancy as error:
            raise _unwritten(error, want, got, r.host(r.bits(), view)) from None
    compared = {region: [v for name, v, _ in checks.compare if name == region] for region in by_name}
    for r in regions:  # guards, gaps, inputs: whatever no check above covered
        changed = np.flatnonzero(expected[r.name] != actual[r.name])
        if r.output and len(changed):  # the outputs' views are compared above, NaN encodings as allowed
            changed = changed[~r.inside(compared[r.name])[changed]]
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


def argument_name(region: str, view: str) -> str:
    """How the contract names the tensor `view` of `region`: a layer's cache of a KV
    copy is `key_caches[l]`, a group's row of a V2 call `rows[g]`, any other its view's name."""
    if region.startswith("layer "):
        return f"{view}s[{region.split()[1]}]"
    name, _, group = view.rpartition(" ")
    return f"{name}[{group}]" if name and group.isdigit() else view


def _unwritten(error: Discrepancy, want: np.ndarray, got: np.ndarray, before: np.ndarray) -> Discrepancy:
    """The error, with a note when the first differing element still holds what it
    held before the call (the kernel never wrote it)."""
    as_bits = UNSIGNED[want.dtype.itemsize]
    differ = np.argwhere(want.view(as_bits) != got.view(as_bits))
    if not len(differ):
        return error
    first = tuple(differ[0])
    if got.view(as_bits)[first] == np.ascontiguousarray(before).view(as_bits)[first]:
        error.notes.append("what it held before the call: the kernel did not write it")
    return error
