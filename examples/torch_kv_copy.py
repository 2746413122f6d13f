"""An example plug-in: docs/contract.md §9's copy (copy-on-write) in plain torch.

The harness calls it with the plug-in contract (README, "Plug-in API"): one cache per
layer in each list, block_mapping int64 [m, 2] of (src, dst). No dst repeats and none
is also a src, so one gather-then-scatter per cache is exact.
"""

import torch


def copy_blocks(key_caches, value_caches, block_mapping):
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    for cache in [*key_caches, *value_caches]:
        # Whole blocks as integers of the same width: bits move, no value is converted.
        bits = cache.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[cache.element_size()])
        bits[dst] = bits[src]
