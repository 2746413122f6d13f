"""Several KV-cache groups, one device-backed table each; row operations broadcast.
A call is checked against every group before any group changes."""

from __future__ import annotations

from collections.abc import Sequence

from blocktable.table import BlockTable


class MultiGroupBlockTable:
    def __init__(self, tables: Sequence[BlockTable]) -> None:
        if not tables:
            raise ValueError("a multi-group table needs at least one group")
        if len({t.max_num_reqs for t in tables}) != 1:
            raise ValueError("every group's table must have the same max_num_reqs")
        self.tables = list(tables)

    def __getitem__(self, group: int) -> BlockTable:
        return self.tables[group]

    def __len__(self) -> int:
        return len(self.tables)

    def _one_list_per_group(self, ids_per_group: Sequence[Sequence[int]]) -> None:
        if len(ids_per_group) != len(self.tables):
            raise ValueError(f"expected one id list per group ({len(self.tables)}), got {len(ids_per_group)}")

    def append_row(self, ids_per_group: Sequence[Sequence[int]], r: int) -> None:
        self._one_list_per_group(ids_per_group)
        for table, ids in zip(self.tables, ids_per_group):
            table.check_append(ids, r)
        for table, ids in zip(self.tables, ids_per_group):
            table.append_row(ids, r)

    def add_row(self, ids_per_group: Sequence[Sequence[int]], r: int) -> None:
        self._one_list_per_group(ids_per_group)
        for table, ids in zip(self.tables, ids_per_group):
            table.row_index(r)
            if table.kernel_ids(ids).size > table.width:
                raise ValueError(f"row {r} overflows group width {table.width}")
        for table, ids in zip(self.tables, ids_per_group):
            table.add_row(ids, r)

    def clear_row(self, r: int) -> None:
        self.tables[0].row_index(r)
        for table in self.tables:
            table.clear_row(r)

    def move_row(self, src: int, dst: int) -> None:
        self.tables[0].row_index(src, "src")
        self.tables[0].row_index(dst, "dst")
        for table in self.tables:
            table.move_row(src, dst)

    def swap_row(self, a: int, b: int) -> None:
        self.tables[0].row_index(a, "a")
        self.tables[0].row_index(b, "b")
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
