"""An example plug-in: the slot mappings of docs/contract.md §10.7 (vLLM's V2 block tables) in plain torch.

The harness calls it with the signature of docs/plugins.md ("vLLM's V2 block tables",
slot mappings). Token `t` of request `b` has position `positions[t]` and reads the row
of slot `idx_mapping[b]` (not the gathered `inp`). Under DCP a sharded group deals each
allocation block's `K * W` positions out to the ranks `I` at a time, and a rank keeps
only its own. Everything else is `-1`: the pad from `T = query_start_loc[N]` to the end
of the buffer, a disabled group, a dummy's tokens, another rank's tokens and a column
past the row.
"""

import torch


def slot_mappings(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, *,
                  kv_block_sizes, kernel_block_sizes, sharded, enabled, cp_world_size, cp_rank, cp_interleave):
    W, R, I = cp_world_size, cp_rank, cp_interleave
    N = idx_mapping.numel()
    starts = query_start_loc[:N + 1].tolist()
    T = starts[N]
    slots.fill_(-1)
    if T == 0:
        return
    device = slots.device
    lengths = torch.tensor([b - a for a, b in zip(starts, starts[1:])], device=device)
    request = torch.repeat_interleave(torch.arange(N, device=device), lengths, output_size=T)
    slot = idx_mapping.long()[request]  # each token's slot; -1 for a dummy's
    p = positions[:T]
    for g, table in enumerate(rows):
        if not enabled[g]:
            continue
        K, B = kv_block_sizes[g], kernel_block_sizes[g]
        if sharded[g] and W > 1:
            block = K  # ownership is decided on allocation blocks (vLLM #51031)
            VB = block * W
            vbi, vbo = p // VB, p % VB
            local = (vbo // I) % W == R
            l = vbi * block + (vbo // (W * I)) * I + vbo % I  # the position among this rank's own
        else:
            local, l = torch.ones_like(p, dtype=torch.bool), p
        col = l // B
        keep = local & (slot >= 0) & (col < table.shape[1])
        block_ids = table[torch.where(keep, slot, 0), torch.where(keep, col, 0)].long()
        slots[g, :T] = torch.where(keep, block_ids * B + l % B, -1)
