"""An example plug-in: the gather of docs/contract.md §10.5 (vLLM's V2 block tables) in plain torch.

The harness calls it with the signature of docs/plugins.md ("vLLM's V2 block tables",
gather). Batch position `b` reads the row of slot `idx_mapping[b]`: its first
`cnt_dev[g, slot]` entries are copied and the entries past them keep what they hold
(stale). A dummy (`-1`) and every padding position up to `num_reqs_padded` become zero
rows; rows from `num_reqs_padded` on are left alone.
"""

import torch


def gather(rows, cnt_dev, inp, idx_mapping, num_reqs_padded):
    n, N = num_reqs_padded, idx_mapping.numel()
    slot = torch.full((n,), -1, dtype=torch.int64, device=cnt_dev.device)
    slot[:N] = idx_mapping.long()  # -1 for the dummies and for every padding position
    real = slot >= 0
    source = slot.clamp(min=0)  # the slot each batch position reads (a dummy reads slot 0, then is zeroed)
    for g, (table, out) in enumerate(zip(rows, inp)):
        columns = torch.arange(table.shape[1], device=table.device)
        count = torch.where(real, cnt_dev[g, source], 0)
        copied = columns[None, :] < count[:, None]
        gathered = torch.where(copied, table[source], out[:n])
        out[:n] = torch.where(real[:, None], gathered, 0)
