"""docs/contract.md §7, the reference's side of the data-level oracle: each sequence's values,
position by position, as a contiguous list. A fork copies the parent's history;
preemption keeps it (the tokens are recomputed into new blocks on resume)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class History:
    def __init__(self) -> None:
        self.values: dict[int, list[int]] = {}

    def add(self, seq: int) -> None:
        if seq in self.values:
            raise ValueError(f"history: sequence {seq} already exists")
        self.values[seq] = []

    def write(self, seq: int, start: int, values: Sequence[int] | np.ndarray) -> None:
        """Positions start, start+1, ... take these values. Writing may overwrite (a
        recompute) but may not leave a hole."""
        history = self.values[seq]
        if not 0 <= start <= len(history):
            raise ValueError(f"history: write at {start} would leave a hole after {len(history)} values")
        for i, v in enumerate(values):
            p = start + i
            if p < len(history):
                history[p] = int(v)
            else:
                history.append(int(v))

    def fork(self, parent: int, child: int) -> None:
        if child in self.values:
            raise ValueError(f"history: sequence {child} already exists")
        self.values[child] = list(self.values[parent])

    def drop(self, seq: int) -> None:
        del self.values[seq]

    def __getitem__(self, seq: int) -> list[int]:
        return self.values[seq]
