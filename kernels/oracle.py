"""The data-level oracle's kernels (docs/contract.md §7): write one value per token into paged
KV caches through slot mappings, copy blocks for copy-on-write pairs, and read
values back through block-table rows.

These are the harness's instruments, not the code under test: `gather` computes
its addresses from the block table itself (as attention does), with its own
arithmetic, so that a slot-mapping kernel under test cannot also bend the read-back.
Every kernel covers all DCP ranks of a group in one launch (grid axis 1 is the
rank); rank r's cache is row r of a [ranks, num_slots] tensor holding slots
[slot_base, slot_base + num_slots), so huge block ids can index a small cache.
"""

import triton
import triton.language as tl

POISON_VALUE = -(2**62)  # an unwritten slot, or a position this rank does not hold
OUT_OF_CACHE_VALUE = POISON_VALUE + 1  # a table entry that points outside the cache
POISON = tl.constexpr(POISON_VALUE)
OUT_OF_CACHE = tl.constexpr(OUT_OF_CACHE_VALUE)

# Compiled once per tile. Left unspecialized: every size, and every pointer's
# alignment (the read-back's positions and a copy's destinations sit at offsets that
# vary from call to call; nothing here vectorizes on it, and the launches are tiny).
# slot_base is always typed int64: a cache of huge block ids starts past int32, and
# Triton would otherwise compile a second variant for it.
WRITE_POINTERS = ["slot_ptr", "value_ptr", "cache_ptr"]
COPY_POINTERS = ["src_ptr", "dst_ptr", "cache_ptr"]
GATHER_POINTERS = ["table_ptr", "row_ptr", "pos_ptr", "cache_ptr", "out_ptr"]


@triton.jit(do_not_specialize=["slot_stride", "num_slots", "num_tokens", "slot_base"],
            do_not_specialize_on_alignment=WRITE_POINTERS)
def write_values(slot_ptr, slot_stride, value_ptr, cache_ptr, num_slots, num_tokens, slot_base: tl.int64,
                 BLOCK: tl.constexpr):
    """cache[rank, slot[rank, t] - slot_base] = value[t] wherever the slot lies in the
    cache: a slot < 0 (padding, another rank's token) or outside it is skipped, so
    even unchecked slots never write past this rank's cache."""
    rank = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < num_tokens
    slot = tl.load(slot_ptr + rank * slot_stride + offs, mask=in_range, other=-1)
    value = tl.load(value_ptr + offs, mask=in_range, other=0)
    index = slot - slot_base  # slot_base >= 0, so every slot < 0 falls below the cache
    in_cache = (index >= 0) & (index < num_slots)
    tl.store(cache_ptr + rank * num_slots + index, value, mask=in_range & in_cache)


@triton.jit(do_not_specialize=["num_slots", "block_slots", "slot_base"], do_not_specialize_on_alignment=COPY_POINTERS)
def copy_blocks(src_ptr, dst_ptr, cache_ptr, num_slots, block_slots, slot_base: tl.int64, BLOCK: tl.constexpr):
    """Block src's slots over block dst's, one program per (pair, rank)."""
    pair = tl.program_id(0)
    cache_ptr += tl.program_id(1).to(tl.int64) * num_slots
    src = tl.load(src_ptr + pair).to(tl.int64) * block_slots - slot_base
    dst = tl.load(dst_ptr + pair).to(tl.int64) * block_slots - slot_base
    for start in range(0, block_slots, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_block = offs < block_slots
        v = tl.load(cache_ptr + src + offs, mask=in_block, other=0)
        tl.store(cache_ptr + dst + offs, v, mask=in_block)


@triton.jit(do_not_specialize=["table_stride", "width", "num_reads", "slot_base", "num_slots", "K", "B", "W", "I"],
            do_not_specialize_on_alignment=GATHER_POINTERS)
def gather(table_ptr, table_stride, width, row_ptr, pos_ptr, cache_ptr, out_ptr, num_reads, slot_base: tl.int64,
           num_slots, K, B, W, I, BLOCK: tl.constexpr):
    """out[rank, i] = the value rank holds for position pos[i] of table row row[i],
    POISON where the rank does not hold it (another rank's, or past the row), and
    OUT_OF_CACHE where the row points outside the cache."""
    rank = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = offs < num_reads
    p = tl.load(pos_ptr + offs, mask=in_range, other=0)
    row = tl.load(row_ptr + offs, mask=in_range, other=0).to(tl.int64)
    per_virtual_block = K * W
    virtual_block = p // per_virtual_block
    within = p % per_virtual_block
    stripe = within // I  # which interleave stripe; stripes go round the ranks
    owner = stripe % W
    local = (stripe // W) * I + within % I
    column = virtual_block * (K // B) + local // B
    readable = in_range & (owner == rank) & (column < width)
    block = tl.load(table_ptr + row * table_stride + column, mask=readable, other=0).to(tl.int64)
    index = block * B + local % B - slot_base
    inside = (index >= 0) & (index < num_slots)
    value = tl.load(cache_ptr + rank.to(tl.int64) * num_slots + index, mask=readable & inside, other=0)
    value = tl.where(inside, value, OUT_OF_CACHE)
    tl.store(out_ptr + rank.to(tl.int64) * num_reads + offs, tl.where(readable, value, POISON), mask=in_range)
