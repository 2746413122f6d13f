"""docs/contract.md §3, last item: one block table per KV-cache group; row operations broadcast.

`append_row`/`add_row` take one id list per group. Every group's part of a call is
validated before any group changes, so an overflow in group 2 leaves group 1 as it was.
"""

from __future__ import annotations

from collections.abc import Sequence

from blocktable.reference.layout import GroupLayout
from blocktable.reference.table import BlockTable


class MultiGroupBlockTable:
    def __init__(self, max_num_reqs: int, max_model_len: int, layouts: Sequence[GroupLayout]) -> None:
        if not layouts:
            raise ValueError("a multi-group table needs at least one group layout")
        self.tables = [BlockTable(max_num_reqs, max_model_len, layout) for layout in layouts]

    def __getitem__(self, group: int) -> BlockTable:
        return self.tables[group]

    def __len__(self) -> int:
        return len(self.tables)

    def _per_group(self, ids_per_group: Sequence[Sequence[int]]) -> None:
        if len(ids_per_group) != len(self.tables):
            raise ValueError(f"expected one id list per group ({len(self.tables)}), got {len(ids_per_group)}")

    def append_row(self, ids_per_group: Sequence[Sequence[int]], r: int) -> None:
        self._per_group(ids_per_group)
        for table, ids in zip(self.tables, ids_per_group):
            table.check_append(ids, r)
        for table, ids in zip(self.tables, ids_per_group):
            table.append_row(ids, r)

    def add_row(self, ids_per_group: Sequence[Sequence[int]], r: int) -> None:
        self._per_group(ids_per_group)
        for table, ids in zip(self.tables, ids_per_group):
            table._check_row(r)
            if len(table.expand(ids)) > table.width:
                raise ValueError(f"row {r} overflows group width {table.width}")
        for table, ids in zip(self.tables, ids_per_group):
            table.add_row(ids, r)

    def clear_row(self, r: int) -> None:
        self.tables[0]._check_row(r)
        for table in self.tables:
            table.clear_row(r)

    def move_row(self, src: int, dst: int) -> None:
        self.tables[0]._check_row(src, "src")
        self.tables[0]._check_row(dst, "dst")
        for table in self.tables:
            table.move_row(src, dst)

    def swap_row(self, a: int, b: int) -> None:
        self.tables[0]._check_row(a, "a")
        self.tables[0]._check_row(b, "b")
        for table in self.tables:
            table.swap_row(a, b)

    def commit(self, n: int) -> None:
        if not 0 <= n <= self.tables[0].max_num_reqs:
            raise ValueError(f"commit count {n} is out of range [0, {self.tables[0].max_num_reqs}]")
        for table in self.tables:
            table.commit(n)

    def clear(self) -> None:
        for table in self.tables:
            table.clear()
