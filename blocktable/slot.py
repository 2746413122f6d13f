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


MAGIC_LIMIT = 2**31  # the multiplier division is exact for numerators below this


def multiplier(d: int) -> tuple[int, int]:
    """(m, s) with n // d == (n * m) >> s for every 0 <= n < 2**31 (the tiled kernel's
    division by a run-time d): s = 31 + ceil(log2 d), m = ceil(2**s / d). Exact because
    m * d - 2**s < d <= 2**(s - 31) (Granlund and Montgomery 1994, theorem 4.2); m lies in
    [2**31, 2**32), so n * m < 2**63 fits an int64, and Triton always types m as one."""
    if d < 1:
        raise ValueError(f"a divisor must be >= 1, got {d}")
    s = 31 + (d - 1).bit_length()
    return -(-(1 << s) // d), s


def division_args(K: int, B: int, W: int, I: int, width: int) -> tuple[list[int], bool]:
    """The tiled kernel's run-time division arguments (limit, then m and s for K*W, I,
    W and B) and whether it may use them. Positions are clamped to `limit`, the first
    position whose column is past the row, so they fit in 31 bits; where that limit
    does not (a row mapping 2**31 positions or more), the kernel divides plainly."""
    limit = -(-width // (K // B)) * K * W
    if limit >= MAGIC_LIMIT or K * W >= MAGIC_LIMIT:
        return [0] * 9, False
    args = [limit]
    for d in (K * W, I, W, B):
        args.extend(multiplier(d))
    return args, True


LARGE_BATCH = 65536  # tokens: above this the tiled kernels are bandwidth-bound, below launch- and latency-bound


def tiled_launch(backend, max_num_tokens: int, num_tokens: int, num_reqs: int) -> tuple[int, int, bool]:
    """(tokens per program, warps, whole tiles) of the tiled kernels, from sweeps on
    an H200 (ci/sweep_tiled.py, docs/results.md): decode batches (no more tokens than
    requests) 64 tokens and 2 warps, the most programs for a latency-bound batch; up to
    64K tokens 256 and 8; above, where the batch is bandwidth-bound, 512 and 4. The
    whole-tile search (one scalar search per tile first) pays where requests are at
    least a tile long on average, and only adds latency to decode-like batches, where
    every tile spans requests.

    The interpreter runs one program at a time as numpy, so there fewer, wider
    programs cost less; it always takes the whole-tile search, which holds the
    per-token search too (for tiles that span requests), so CPU runs cover both."""
    if backend.interpreted:
        return 1024, 4, True
    if 0 < num_tokens <= num_reqs:
        tile, warps = 64, 2
    elif max_num_tokens <= LARGE_BATCH:
        tile, warps = 256, 8
    else:
        tile, warps = 512, 4
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
                     T, Tmax, block_table.shape[1], kernel_block_size, K=kv_block_size,
                     P=kv_block_size // kernel_block_size, W=cp_world_size, R=cp_rank, I=cp_interleave,
                     BLOCK=TOKENS_PER_TILE)


def _tiled(kernel_name: str, query_start_loc: torch.Tensor, positions: torch.Tensor, block_table: torch.Tensor,
           slot_mapping: torch.Tensor, kv_block_size: int, kernel_block_size: int, cp_world_size: int,
           cp_rank: int, cp_interleave: int) -> None:
    backend = current()
    check_config(kv_block_size, kernel_block_size, cp_world_size, cp_rank, cp_interleave)
    N, T, Tmax = check_slot_inputs(query_start_loc, positions, block_table, slot_mapping, backend)
    if Tmax == 0:
        return
    from blocktable.kernels import slot_mapping as kernels

    specialized = kernel_name.endswith("specialized")
    tile, warps, whole_tiles = tiled_launch(backend, Tmax, T, N)
    division: dict[str, object] = {}
    if not specialized:
        args, magic = division_args(kv_block_size, kernel_block_size, cp_world_size, cp_interleave,
                                    block_table.shape[1])
        division = dict(zip(("limit", "m_vb", "s_vb", "m_i", "s_i", "m_w", "s_w", "m_b", "s_b"), args), MAGIC=magic)
    getattr(kernels, kernel_name)[(-(-Tmax // tile),)](
        query_start_loc, positions, block_table, block_table.stride(0), slot_mapping,
        N, T, Tmax, block_table.shape[1], kv_block_size, kernel_block_size, cp_world_size, cp_rank,
        cp_interleave, **division, SEARCH_STEPS=max(0, N - 1).bit_length(), BLOCK=tile, WHOLE_TILES=whole_tiles,
        DECODE=0 < T <= N, num_warps=warps)


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
