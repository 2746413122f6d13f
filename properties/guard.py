"""Guard regions around every tensor handed to a kernel under test.

The block table the kernel sees is the interior of a larger buffer whose extra
rows and columns hold GUARD_BLOCK, so a kernel that reads outside its row (or past
the table) reads poison and produces a slot the reference never would, even on the
CPU, where the interpreter reads stray memory silently. Inputs get trailing guards
too, and the output sits between guard cells that the kernel must leave alone.
After each call the guards, and the inputs, must be exactly as they were.
"""

from __future__ import annotations

import torch

from blocktable.properties.compare import Discrepancy

GUARD_BLOCK = -0x5A5A5A5A  # a negative block id: any slot made from it is negative and not -1
GUARD_ROWS = 2
GUARD_COLS = 4
GUARD_TOKENS = 64
GUARD_SLOT = 0x3C3C3C3C3C3C3C3C  # around the output: a kernel must not write there
GUARD_POSITION = 0x7FFF_FFFF_FFFF  # past the last position: never a position the harness schedules
GUARD_QSL = 0x7FFF_FFFF


UNWRITTEN = 0x5A5A5A5A5A5A5A5A  # poured into every kernel output first: an unwritten slot shows


class Guarded:
    """A tensor of `shape` living inside a buffer of `fill`, margin `pad` per dim."""

    def __init__(self, shape: tuple[int, ...], pad: tuple[int, ...], dtype: torch.dtype, fill: int,
                 device: torch.device, lead: bool = True) -> None:
        self.fill = fill
        outer = tuple(n + (2 if lead else 1) * p for n, p in zip(shape, pad))
        self.buffer = torch.full(outer, fill, dtype=dtype, device=device)
        self.index = tuple(slice(p if lead else 0, (p if lead else 0) + n) for n, p in zip(shape, pad))
        self.view = self.buffer[self.index]
        self.pristine: torch.Tensor | None = None

    def load(self, value: torch.Tensor) -> torch.Tensor:
        """An input: the kernel must change nothing, the view included."""
        self.view.copy_(value)
        self.pristine = self.buffer.clone()
        return handed(self.view)

    def pour(self, value: int) -> torch.Tensor:
        """An output filled with `value`: the kernel may write the view, not the guard."""
        self.view.fill_(value)
        self.pristine = None
        return self.view

    def changed(self) -> torch.Tensor:
        """Where the buffer differs from what the kernel was handed (the view of an
        output excepted)."""
        if self.pristine is not None:
            return self.buffer != self.pristine
        changed = self.buffer != self.fill
        changed[self.index] = False
        return changed


def handed(view: torch.Tensor) -> torch.Tensor:
    """What a kernel is handed for `view`. A zero-size tensor owns no memory (its
    address is 0 on the CPU and on CUDA), so a kernel that reads any of it, even in
    a lane whose result it drops, faults here as it would in an engine; a view into
    the guard would hide it."""
    if view.numel() == 0:
        return torch.empty(view.shape, dtype=view.dtype, device=view.device)
    return view


class GuardedCall:
    """The contract tensors of one or more slot-mapping calls on the same inputs (one
    per DCP rank, say): the three inputs, each behind guards, and one output row per
    call in a single guarded buffer, every row between guard cells. `outputs` names
    each call's output in reports, `label` the calls themselves."""

    def __init__(self, rows: int, width: int, num_reqs: int, num_tokens: int, max_tokens: int,
                 device: torch.device, outputs: tuple[str, ...] = ("slot_mapping",), label: str = "") -> None:
        self.table = Guarded((rows, width), (GUARD_ROWS, GUARD_COLS), torch.int32, GUARD_BLOCK, device)
        self.qsl = Guarded((num_reqs + 1,), (GUARD_TOKENS,), torch.int32, GUARD_QSL, device, lead=False)
        self.positions = Guarded((num_tokens,), (GUARD_TOKENS,), torch.int64, GUARD_POSITION, device, lead=False)
        self.out = Guarded((len(outputs), max_tokens), (0, GUARD_TOKENS), torch.int64, GUARD_SLOT, device)
        self.outputs = self.out.pour(UNWRITTEN)  # [calls, max_tokens]: every slot UNWRITTEN
        self.names = outputs
        self.label = label

    def output(self, i: int = 0) -> torch.Tensor:
        """Call i's output."""
        return handed(self.outputs[i])

    def check(self) -> None:
        """Every guard and input as it was. One device sync for every call together
        (nothing touched is the common case); the detail only on failure."""
        parts = [(self.table, "block_table"), (self.qsl, "query_start_loc"), (self.positions, "positions"),
                 (self.out, None)]
        changes = [guarded.changed() for guarded, _ in parts]
        if not bool(torch.stack([c.any() for c in changes]).any()):
            return
        for (guarded, what), changed in zip(parts, changes):
            if bool(changed.any()):
                where = [int(i) for i in torch.nonzero(changed)[0]]
                name = f"{self.label} {what or self.names[where[0]]}".strip()
                place = "outside" if what is None else "into"
                raise Discrepancy(f"{name} guard", f"the kernel wrote {place} {name} (buffer index {where}, "
                                                   f"{int(changed.sum())} elements changed)")
