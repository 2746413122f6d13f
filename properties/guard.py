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


class Guarded:
    """A tensor of `shape` living inside a buffer of `fill`, margin `pad` per dim."""

    def __init__(self, shape: tuple[int, ...], pad: tuple[int, ...], dtype: torch.dtype, fill: int,
                 device: torch.device, lead: bool = True) -> None:
        self.pad = pad
        self.lead = lead
        outer = tuple(n + (2 if lead else 1) * p for n, p in zip(shape, pad))
        self.buffer = torch.full(outer, fill, dtype=dtype, device=device)
        index = tuple(slice(p if lead else 0, (p if lead else 0) + n) for n, p in zip(shape, pad))
        self.view = self.buffer[index]
        self.pristine: torch.Tensor | None = None

    def load(self, value: torch.Tensor) -> torch.Tensor:
        self.view.copy_(value)
        self.pristine = self.buffer.clone()
        if self.view.numel() == 0:
            # A zero-size tensor owns no memory (its address is 0 on the CPU and on CUDA),
            # so a kernel that reads any of it, even in a lane whose result it drops,
            # faults here as it would in an engine; a view into the guard would hide it.
            return torch.empty(self.view.shape, dtype=self.view.dtype, device=self.view.device)
        return self.view

    def _changed(self, kernel_may_write_view: bool) -> torch.Tensor:
        assert self.pristine is not None
        changed = self.buffer != self.pristine
        if kernel_may_write_view:
            index = tuple(slice(p if self.lead else 0, (p if self.lead else 0) + n)
                          for n, p in zip(self.view.shape, self.pad))
            changed[index] = False
        return changed

    def touched(self, kernel_may_write_view: bool) -> torch.Tensor:
        """A 0-d bool tensor (no device sync): did anything change that must not?"""
        return self._changed(kernel_may_write_view).any()

    def check(self, what: str, kernel_may_write_view: bool) -> None:
        """The guards are untouched (and the view too, for an input)."""
        changed = self._changed(kernel_may_write_view)
        if bool(changed.any()):
            where = [int(i) for i in torch.nonzero(changed)[0]]
            place = "outside" if kernel_may_write_view else "into"
            raise Discrepancy(f"{what} guard", f"the kernel wrote {place} {what} (buffer index {where}, "
                                               f"{int(changed.sum())} elements changed)")


class GuardedCall:
    """The four contract tensors of one slot-mapping call, each behind guards."""

    def __init__(self, rows: int, width: int, num_reqs: int, num_tokens: int, max_tokens: int,
                 device: torch.device) -> None:
        self.table = Guarded((rows, width), (GUARD_ROWS, GUARD_COLS), torch.int32, GUARD_BLOCK, device)
        self.qsl = Guarded((num_reqs + 1,), (GUARD_TOKENS,), torch.int32, GUARD_QSL, device, lead=False)
        self.positions = Guarded((num_tokens,), (GUARD_TOKENS,), torch.int64, GUARD_POSITION, device, lead=False)
        self.out = Guarded((max_tokens,), (GUARD_TOKENS,), torch.int64, GUARD_SLOT, device)

    def check(self) -> None:
        parts = [(self.table, "block_table", False), (self.qsl, "query_start_loc", False),
                 (self.positions, "positions", False), (self.out, "slot_mapping", True)]
        # One device sync for the common case (nothing touched); the detail only on failure.
        touched = torch.stack([g.touched(may_write) for g, _, may_write in parts])
        if bool(touched.any()):
            for guarded, what, may_write in parts:
                guarded.check(what, kernel_may_write_view=may_write)
