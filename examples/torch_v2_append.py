"""An example plug-in: the append of docs/contract.md §10.4 (vLLM's V2 block tables) in plain torch.

The harness calls it with the signature of docs/plugins.md ("vLLM's V2 block tables",
append). Write `i` puts `staged_ids[cu_staged[i]:cu_staged[i+1]]` into row
`staged_row[i]` of group `staged_group[i]` from column `staged_start[i]`. The writes
land one after another, so where two overlap the later one wins; then the device counts
become the host's. A row tensor may be a row-strided view into a larger buffer: writing
through the view touches nothing outside it.
"""


def append(rows, cnt_dev, cnt, staged_group, staged_row, staged_start, staged_ids, cu_staged):
    groups, slots, starts = staged_group.tolist(), staged_row.tolist(), staged_start.tolist()
    ends = cu_staged.tolist()
    for i, (g, r, start) in enumerate(zip(groups, slots, starts)):
        ids = staged_ids[ends[i]:ends[i + 1]]
        rows[g][r, start:start + ids.numel()] = ids
    cnt_dev.copy_(cnt)
