"""An example plug-in: docs/contract.md §9's write in plain torch, as a third party might write it.

The harness calls it with the plug-in contract (README, "Plug-in API"). The caches may
be views of one tensor, with any strides: index them, never reshape them. Key rows
past len(slot_mapping) are padding. k_scale and v_scale are Python floats.
"""

import torch


def write(key, value, key_cache, value_cache, slot_mapping, *, layout, kv_cache_dtype, k_scale, v_scale):
    block_size = key_cache.shape[1] if layout == "NHD" else key_cache.shape[2]
    tokens = torch.nonzero(slot_mapping >= 0).squeeze(1)  # a negative slot writes nothing
    slots = slot_mapping[tokens]
    block, offset = slots // block_size, slots % block_size
    for x, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        rows = x[tokens]
        if kv_cache_dtype == "fp8_e4m3":
            # A device tensor, not a host scalar: CUDA torch would multiply by 1 / scale.
            divisor = torch.tensor([scale], dtype=torch.float32, device=x.device)
            rows = (rows.float() / divisor).clamp(-448, 448)  # saturate; NaN stays NaN
            rows = rows.to(torch.float8_e4m3fn).view(torch.uint8)  # a NaN keeps its sign: 0x7F or 0xFF
        if layout == "NHD":
            cache[block, offset] = rows
        else:
            cache[block, :, offset] = rows
