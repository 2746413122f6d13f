"""An example plug-in: docs/contract.md §9's gather (read back through the block table) in plain torch.

The harness calls it with the plug-in contract (README, "Plug-in API"): block_table int32,
cu_lens int32 [N+1]; out rows past cu_lens[N] must keep what they hold. fp8 caches are
decoded and multiplied by the scale in float32 (a NaN code reads as whatever NaN
torch's decode gives: any NaN will do).
"""

import torch


def gather(key_cache, value_cache, block_table, cu_lens, out_key, out_value, *, layout, kv_cache_dtype,
           k_scale, v_scale):
    block_size = key_cache.shape[1] if layout == "NHD" else key_cache.shape[2]
    starts = cu_lens.tolist()
    for r in range(len(starts) - 1):
        j = torch.arange(starts[r + 1] - starts[r], device=cu_lens.device)
        block, offset = block_table[r, j // block_size].long(), j % block_size
        for cache, out, scale in ((key_cache, out_key, k_scale), (value_cache, out_value, v_scale)):
            entries = cache[block, offset] if layout == "NHD" else cache[block, :, offset]
            if kv_cache_dtype == "fp8_e4m3":
                decoded = entries.view(torch.float8_e4m3fn).float()
                entries = decoded * torch.tensor([scale], dtype=torch.float32, device=decoded.device)
            out[starts[r]:starts[r + 1]] = entries
