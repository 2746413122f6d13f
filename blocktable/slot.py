"""Our slot-mapping kernels behind the plug-in contract (docs/plugins.md):

    fn(query_start_loc, positions, block_table, slot_mapping, *, kv_block_size,
       kernel_block_size, cp_world_size, cp_rank, cp_interleave) -> None

int32 [N+1], int64 [T], int32 [rows, width], int64 [Tmax] written in place, the
-1 tail included. Every input is checked before a launch (blocktable.checks).
"""

from __future__ import annotations

import torch

from blocktable.checks import check_config, check_slot_inputs
from blocktable.device import current

TOKENS_PER_TILE = 1024  # vLLM's tile, kept by the per-request baseline


LARGE_BATCH = 65536  # tokens: above this the tiled kernels are bandwidth-bound, below launch- and latency-bound


def tiled_launch(backend, max_num_tokens: int, num_tokens: int, num_reqs: int,
                 specialized: bool = False) -> tuple[int, int, bool]:
    """(tokens per program, warps, whole tiles) of the tiled kernels, from sweeps on
    an H200 (docs/results.md). Tiles: up to 64K tokens (launch- and
    latency-bound) 256 tokens and 8 warps; above, 256 x 4 for the run-time kernel
    and 1024 x 4 for the specialized one. The whole-tile search (one scalar search
    per tile first) pays where requests are at least a tile long on average, and
    only adds latency to decode-like batches, where every tile spans requests.

    The interpreter runs one program at a time as numpy, so there fewer, wider
    programs cost less; it always takes the whole-tile search, which holds the
    per-token search too (for tiles that span requests), so CPU runs cover both."""
    if backend.interpreted:
        return 1024, 4, True
    if max_num_tokens <= LARGE_BATCH:
        tile, warps = 256, 8
    else:
        tile, warps = (1024, 4) if specialized else (256, 4)
    return tile, warps, num_tokens >= tile * num_reqs


def slot_mapping_per_request(query_start_loc: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
                             slot_mapping: torch.Tensor, *, kv_block_size: int, kernel_block_size: int,
                             cp_world_size: int = 1, cp_rank: int = 0, cp_interleave: int = 1) -> None:
    """One program per request, looping over its tokens; one more pads the tail."""
    backend = current()
    check_config(kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave)
    N, T, Tmax = check_slot_inputs(query_start_loc, positions, block_table, slot_mapping, backend)
    from blocktable.kernels.slot_mapping import slot_mapping_per_request as kernel

    kernel[(N + 1,)](query_start_loc, positions, block_table, block_table.stride(0), slot_mapping,
                     T, Tmax, block_table.shape[1], kv_block_size, kernel_block_size,
                     cp_world_size, cp_rank, cp_interleave, BLOCK=TOKENS_PER_TILE)


def _tiled(kernel_name: str, query_start_loc: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
           slot_mapping: torch.Tensor, kv_block_size: int, kernel_block_size: int, cp_world_size: int,
           cp_rank: int, cp_interleave: int) -> None:
    backend = current()
    check_config(kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave)
    N, T, Tmax = check_slot_inputs(query_start_loc, positions, block_table, slot_mapping, backend)
    if Tmax == 0:
        return
    from blocktable.kernels import slot_mapping as kernels

    tile, warps, whole_tiles = tiled_launch(backend, Tmax, T, N, specialized=kernel_name.endswith("specialized"))
    getattr(kernels, kernel_name)[(-(-Tmax // tile),)](
        query_start_loc, positions, block_table, block_table.stride(0), slot_mapping,
        N, T, Tmax, block_table.shape[1], kv_block_size, kernel_block_size, cp_world_size, cp_rank,
        cp_interleave, SEARCH_STEPS=max(0, N - 1).bit_length(), BLOCK=tile, WHOLE_TILES=whole_tiles,
        num_warps=warps)


def slot_mapping_tiled(query_start_loc: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
                       slot_mapping: torch.Tensor, *, kv_block_size: int, kernel_block_size: int,
                       cp_world_size: int = 1, cp_rank: int = 0, cp_interleave: int = 1) -> None:
    """A grid over token tiles of the whole [Tmax] output; each token finds its request
    by binary search over query_start_loc. One compilation for every configuration."""
    _tiled("slot_mapping_tiled", query_start_loc, positions, block_table, slot_mapping, kv_block_size,
           kernel_block_size, cp_world_size, cp_rank, cp_interleave)


def slot_mapping_tiled_specialized(query_start_loc: torch.Tensor, positions: torch.Tensor,
                                   block_table: torch.Tensor, slot_mapping: torch.Tensor, *, kv_block_size: int,
                                   kernel_block_size: int, cp_world_size: int = 1, cp_rank: int = 0,
                                   cp_interleave: int = 1) -> None:
    """The tiled kernel compiled for this K, B, W and I (a serving engine's fixed
    sizes): faster, at one compilation per configuration."""
    _tiled("slot_mapping_tiled_specialized", query_start_loc, positions, block_table, slot_mapping, kv_block_size,
           kernel_block_size, cp_world_size, cp_rank, cp_interleave)
