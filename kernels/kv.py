"""docs/contract.md §9 as Triton kernels: write tokens into paged KV caches, copy blocks,
gather tokens back through a block table. The checked entry points are in
blocktable.kv; these kernels trust their arguments, except that they never touch
memory outside the caches: a slot or block id outside them is skipped (the host
checks reject one first, unless switched off).

How they address memory: every cache is reached through four strides passed as
arguments, (block, offset in block, head, element of D), in that order whatever the
layout: the wrapper permutes the tensor's strides for "HND". So one kernel serves
both layouts and any strides (two caches that are views of one tensor included).
What vectorizes the loads and stores along D is a unit stride along D (specialized
by Triton, as a compile-time 1) and, for every tensor moved, a 16-byte aligned
pointer and strides that are multiples of 16. Triton would specialize each pointer
and stride on that separately, one compilation per pattern; a fuzzing run meets
most patterns and pays each on first use. So the other strides are passed divided
by ALIGN and multiplied back in the kernel, and each kernel is compiled twice: with
ALIGN = 16 when every tensor moved is aligned (its data pointers specialized, all of
them aligned), and with ALIGN = 1 otherwise (no data pointer specialized). The index
tensors (slots, pairs, block table, cu_lens) keep Triton's specialization: a fuzzing
run passes them one way. Sizes (token, slot, block and request counts, the block
size, the head count) are left unspecialized: they vectorize nothing. Strides are
multiplied back in int64, and block ids, token indices and heads are widened to
int64 before they multiply one (a block id times a block's stride passes 2**31 in
large caches); divisions stay in int32 where the values fit (a 64-bit division is a
call to a long subroutine on a GPU).

The grids: write and gather run one program per (tile of TOKENS tokens, group of
HEADS heads), each moving a [TOKENS, HEADS, D] tile of the key and of the value (the
head size is a compile-time constant, padded to a power of two BLOCK_D). A token's
own work (its slot, or its request and block) is done once for all the heads of its
program: on a GPU that per-token work, repeated per head, cost more than the fp8
arithmetic. Copy runs one program per (pair, tile of ROWS rows of a block), a row
being the innermost dimension. No kernel loops over a run-time bound.

"auto" moves bits: the wrapper views float caches and tensors as integers of the
same width, so no value is converted (NaN payloads included). fp8 goes through the
codec of blocktable.kernels.fp8.
"""

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl

from blocktable.kernels.fp8 import e4m3_decode, quantize

# Modes of `write_tokens`: a bit copy, or fp8 from the key's float type.
WRITE_MODES = ("copy", "fp8_from_float16", "fp8_from_bfloat16", "fp8_from_float32")

# Left unspecialized (see above): sizes, the gather's block-table row stride (it only
# addresses single block ids), and the strides that ALIGN multiplies. The data
# pointers are specialized only in the ALIGN = 16 compilation, where all are aligned.
WRITE_INTEGERS = ["num_tokens", "num_slots", "block_size", "num_heads",
                  "key_stride_token", "key_stride_head", "value_stride_token", "value_stride_head",
                  "kc_stride_block", "kc_stride_offset", "kc_stride_head",
                  "vc_stride_block", "vc_stride_offset", "vc_stride_head"]
WRITE_DATA_POINTERS = ["key_ptr", "value_ptr", "key_cache_ptr", "value_cache_ptr"]
COPY_INTEGERS = ["num_blocks", "rows", "size_2",
                 "kc_stride_0", "kc_stride_1", "kc_stride_2", "vc_stride_0", "vc_stride_1", "vc_stride_2"]
COPY_DATA_POINTERS = ["key_cache_ptr", "value_cache_ptr"]
GATHER_INTEGERS = ["table_stride_0", "num_reqs", "num_blocks", "block_size", "width", "out_rows", "num_heads",
                   "kc_stride_block", "kc_stride_offset", "kc_stride_head",
                   "vc_stride_block", "vc_stride_offset", "vc_stride_head",
                   "ok_stride_token", "ok_stride_head", "ov_stride_token", "ov_stride_head"]
GATHER_DATA_POINTERS = ["key_cache_ptr", "value_cache_ptr", "out_key_ptr", "out_value_ptr"]
ALIGNMENT = 16  # the aligned compilation's ALIGN: its strides are passed divided by it


def aligned_and_unaligned(fn: Callable[..., None], integers: list[str], data_pointers: list[str]) -> tuple[Any, Any]:
    """The kernel `fn` jitted twice (see above): for ALIGN = 16 and for ALIGN = 1.
    (Any: a JITFunction, or under the interpreter an InterpretedFunction.)"""
    aligned = triton.jit(do_not_specialize=integers)(fn)
    unaligned = triton.jit(do_not_specialize=integers, do_not_specialize_on_alignment=data_pointers)(fn)
    return aligned, unaligned


@triton.jit
def to_cache(x, scale, reciprocal, MODE: tl.constexpr, EXACT_DIVISION: tl.constexpr, HARDWARE_FP8: tl.constexpr):
    if MODE == "copy":
        y = x
    else:
        if MODE == "fp8_from_bfloat16":  # x holds bf16 bits as int16: the float32's top half
            f = (x.to(tl.int32) << 16).to(tl.float32, bitcast=True)
        else:
            f = x.to(tl.float32)  # exact from float16
        y = quantize(f, scale, reciprocal, EXACT_DIVISION, HARDWARE_FP8)
    return y


@triton.jit
def tile_mask(keep, heads, num_heads, d, HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr,
              EVEN_HEADS: tl.constexpr):
    """[TOKENS, HEADS, BLOCK_D] mask from the tokens' `keep`; the head and D parts only
    where they can be false, so that the mask stays constant along D (what lets the
    accesses vectorize)."""
    mask = keep[:, None, None]
    if not EVEN_HEADS:
        mask = mask & (heads < num_heads)[None, :, None]
    if BLOCK_D != HEAD_SIZE:
        mask = mask & (d < HEAD_SIZE)[None, None, :]
    return mask


@triton.jit
def restored(stride, ALIGN: tl.constexpr):
    """A stride passed divided by ALIGN, multiplied back: in int64, where the product
    of a quotient that fits int32 may not; on the scalar, not on every address."""
    return stride.to(tl.int64) * ALIGN


@triton.jit
def write_one(src_ptr, src_stride_token, src_stride_head, src_stride_d, cache_ptr, stride_block, stride_offset,
              stride_head, stride_d, t, block, offset, heads, d, mask, scale, reciprocal, MODE: tl.constexpr,
              EXACT_DIVISION: tl.constexpr, HARDWARE_FP8: tl.constexpr, ALIGN: tl.constexpr):
    src = (t * restored(src_stride_token, ALIGN))[:, None, None] \
        + (heads * restored(src_stride_head, ALIGN))[None, :, None] + (d * src_stride_d)[None, None, :]
    x = tl.load(src_ptr + src, mask=mask)
    place = (block * restored(stride_block, ALIGN) + offset * restored(stride_offset, ALIGN))[:, None, None] \
        + (heads * restored(stride_head, ALIGN))[None, :, None] + (d * stride_d)[None, None, :]
    tl.store(cache_ptr + place, to_cache(x, scale, reciprocal, MODE, EXACT_DIVISION, HARDWARE_FP8), mask=mask)


def _write_tokens(key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr, slot_stride,
                 num_tokens, num_slots, block_size, num_heads,
                 key_stride_token, key_stride_head, key_stride_d,
                 value_stride_token, value_stride_head, value_stride_d,
                 kc_stride_block, kc_stride_offset, kc_stride_head, kc_stride_d,
                 vc_stride_block, vc_stride_offset, vc_stride_head, vc_stride_d,
                 k_scale, k_reciprocal, v_scale, v_reciprocal,
                 HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, TOKENS: tl.constexpr, HEADS: tl.constexpr,
                 EVEN_HEADS: tl.constexpr, MODE: tl.constexpr, EXACT_DIVISION: tl.constexpr,
                 HARDWARE_FP8: tl.constexpr, SLOTS_INT32: tl.constexpr, ALIGN: tl.constexpr):
    """Tokens t < num_tokens with 0 <= slot < num_slots: cache entry (slot // block_size,
    slot % block_size) = key[t] (value[t]), for this program's heads. SLOTS_INT32:
    every slot of the cache fits in int32, so the division can be 32-bit.
    HARDWARE_FP8: fp8 codes from the GPU's conversion (see `quantize`)."""
    t = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    heads = tl.program_id(1).to(tl.int64) * HEADS + tl.arange(0, HEADS)
    slot = tl.load(slot_ptr + t * slot_stride, mask=t < num_tokens, other=-1)
    keep = (slot >= 0) & (slot < num_slots)  # < 0: no write; past the cache: only unchecked calls get here
    slot = tl.where(keep, slot, 0)
    if SLOTS_INT32:
        slot32 = slot.to(tl.int32)
        block32 = slot32 // block_size
        offset = slot32 - block32 * block_size
        block = block32.to(tl.int64)
    else:
        block = slot // block_size
        offset = slot - block * block_size
    d = tl.arange(0, BLOCK_D)
    mask = tile_mask(keep, heads, num_heads, d, HEAD_SIZE, BLOCK_D, EVEN_HEADS)
    write_one(key_ptr, key_stride_token, key_stride_head, key_stride_d, key_cache_ptr, kc_stride_block,
              kc_stride_offset, kc_stride_head, kc_stride_d, t, block, offset, heads, d, mask, k_scale, k_reciprocal,
              MODE, EXACT_DIVISION, HARDWARE_FP8, ALIGN)
    write_one(value_ptr, value_stride_token, value_stride_head, value_stride_d, value_cache_ptr, vc_stride_block,
              vc_stride_offset, vc_stride_head, vc_stride_d, t, block, offset, heads, d, mask, v_scale, v_reciprocal,
              MODE, EXACT_DIVISION, HARDWARE_FP8, ALIGN)


write_tokens, write_tokens_unaligned = aligned_and_unaligned(_write_tokens, WRITE_INTEGERS, WRITE_DATA_POINTERS)


@triton.jit
def copy_one(cache_ptr, src, dst, stride_block, stride_1, stride_2, stride_3, i1, i2, c, mask, ALIGN: tl.constexpr):
    stride_block = restored(stride_block, ALIGN)
    inside = (i1 * restored(stride_1, ALIGN) + i2 * restored(stride_2, ALIGN))[:, None] + c[None, :] * stride_3
    x = tl.load(cache_ptr + src * stride_block + inside, mask=mask)
    tl.store(cache_ptr + dst * stride_block + inside, x, mask=mask)


def _copy_blocks(key_cache_ptr, value_cache_ptr, pairs_ptr, pairs_stride_0, pairs_stride_1, num_blocks,
                rows, size_2,
                kc_stride_0, kc_stride_1, kc_stride_2, kc_stride_3,
                vc_stride_0, vc_stride_1, vc_stride_2, vc_stride_3,
                INNER: tl.constexpr, BLOCK_INNER: tl.constexpr, ROWS: tl.constexpr, ALIGN: tl.constexpr):
    """Block dst = block src in both caches of one layer, for pair program_id(0): rows
    program_id(1) * ROWS onwards. A cache is [num_blocks, size_1, size_2, INNER]; its
    rows are the size_1 * size_2 runs of INNER elements."""
    pair = tl.program_id(0).to(tl.int64)
    src = tl.load(pairs_ptr + pair * pairs_stride_0)
    dst = tl.load(pairs_ptr + pair * pairs_stride_0 + pairs_stride_1)
    inside = (src >= 0) & (src < num_blocks) & (dst >= 0) & (dst < num_blocks)  # unchecked ids: skipped
    # A pair outside the caches copies no row. (Not `(r < rows) & inside`: a scalar
    # and-ed into a tensor makes a mask the interpreter cannot load with.)
    rows = tl.where(inside, rows, 0)
    r = tl.program_id(1).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    i1 = r // size_2
    i2 = r - i1 * size_2
    c = tl.arange(0, BLOCK_INNER)
    if BLOCK_INNER == INNER:
        mask = (r < rows)[:, None]
    else:
        mask = (r < rows)[:, None] & (c < INNER)[None, :]
    copy_one(key_cache_ptr, src, dst, kc_stride_0, kc_stride_1, kc_stride_2, kc_stride_3, i1, i2, c, mask, ALIGN)
    copy_one(value_cache_ptr, src, dst, vc_stride_0, vc_stride_1, vc_stride_2, vc_stride_3, i1, i2, c, mask, ALIGN)


copy_blocks, copy_blocks_unaligned = aligned_and_unaligned(_copy_blocks, COPY_INTEGERS, COPY_DATA_POINTERS)


@triton.jit
def token_requests(cu_ptr, t, valid, num_reqs, SEARCH_STEPS: tl.constexpr):
    """Each token's request: the last r < num_reqs with cu[r] <= t (an empty request
    r has cu[r] = cu[r+1], so the search passes over it), by a branch-free binary
    search of SEARCH_STEPS >= ceil(log2(num_reqs)) halvings; the window [r, r + size)
    always holds the answer, and a halving of a window of one changes nothing."""
    r = tl.zeros_like(t)
    size = num_reqs
    for _ in tl.static_range(SEARCH_STEPS):
        half = size // 2
        start = tl.load(cu_ptr + r + half, mask=valid, other=0)
        r = tl.where(start <= t, r + half, r)
        size -= half
    return r


@triton.jit
def first_request(cu_ptr, first, num_reqs, SEARCH_STEPS: tl.constexpr):
    """The same search for one token, in scalars: one load per halving for the tile."""
    r = 0
    size = num_reqs
    for _ in tl.static_range(SEARCH_STEPS):
        half = size // 2
        r = tl.where(tl.load(cu_ptr + r + half) <= first, r + half, r)
        size -= half
    return r


@triton.jit
def gather_one(cache_ptr, stride_block, stride_offset, stride_head, stride_d, out_ptr, out_stride_token,
               out_stride_head, out_stride_d, t, block, offset, heads, d, mask, scale, FP8: tl.constexpr,
               ALIGN: tl.constexpr):
    place = (block * restored(stride_block, ALIGN) + offset * restored(stride_offset, ALIGN))[:, None, None] \
        + (heads * restored(stride_head, ALIGN))[None, :, None]
    if FP8:
        # The same offsets, but seen by the compiler as runs of 4: then the one-byte
        # codes are loaded 4 to a thread, as the float32 results are stored, and no
        # layout conversion through shared memory sits between the two.
        d_codes = (d // 4) * 4 + d % 4
        codes = tl.load(cache_ptr + place + (d_codes * stride_d)[None, None, :], mask=mask)
        x = e4m3_decode(codes.to(tl.int32), scale)
    else:
        x = tl.load(cache_ptr + place + (d * stride_d)[None, None, :], mask=mask)
    out = (t * restored(out_stride_token, ALIGN))[:, None, None] \
        + (heads * restored(out_stride_head, ALIGN))[None, :, None] + (d * out_stride_d)[None, None, :]
    tl.store(out_ptr + out, x, mask=mask)


def _gather_tokens(key_cache_ptr, value_cache_ptr, table_ptr, table_stride_0, table_stride_1, cu_ptr,
                  out_key_ptr, out_value_ptr, num_reqs, num_blocks, block_size, width, out_rows, num_heads,
                  kc_stride_block, kc_stride_offset, kc_stride_head, kc_stride_d,
                  vc_stride_block, vc_stride_offset, vc_stride_head, vc_stride_d,
                  ok_stride_token, ok_stride_head, ok_stride_d,
                  ov_stride_token, ov_stride_head, ov_stride_d,
                  k_scale, v_scale,
                  HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, TOKENS: tl.constexpr, HEADS: tl.constexpr,
                  EVEN_HEADS: tl.constexpr, SEARCH_STEPS: tl.constexpr, FP8: tl.constexpr, ALIGN: tl.constexpr):
    """Output rows t < cu[num_reqs]: out[t] = the cache entry of token j = t - cu[r] of
    its request r, at block table[r, j // block_size], offset j % block_size, for this
    program's heads. The grid covers the outputs' rows (the token count cu[N] is
    device data); rows past cu[N] are left alone, as are rows whose block lies outside
    the cache or past the row (only unchecked calls have them). Token indices are
    int32 (cu_lens is), widened only to address the outputs."""
    first = tl.program_id(0) * TOKENS
    t = first + tl.arange(0, TOKENS)
    heads = tl.program_id(1).to(tl.int64) * HEADS + tl.arange(0, HEADS)
    total = tl.load(cu_ptr + num_reqs)
    valid = (t < total) & (t < out_rows)
    # One search for the tile's first token; a tile inside that request (most of a
    # prefill's) skips the search per token.
    r0 = first_request(cu_ptr, first, num_reqs, SEARCH_STEPS)
    if tl.load(cu_ptr + r0 + 1) >= first + TOKENS:
        r = tl.zeros([TOKENS], dtype=tl.int32) + r0
    else:
        r = token_requests(cu_ptr, t, valid, num_reqs, SEARCH_STEPS)
    j = t - tl.load(cu_ptr + r, mask=valid, other=0)
    column = j // block_size
    offset = j - column * block_size
    in_row = valid & (column < width)
    row = r.to(tl.int64) * table_stride_0 + column.to(tl.int64) * table_stride_1
    block = tl.load(table_ptr + row, mask=in_row, other=0).to(tl.int64)
    keep = in_row & (block >= 0) & (block < num_blocks)
    d = tl.arange(0, BLOCK_D)
    mask = tile_mask(keep, heads, num_heads, d, HEAD_SIZE, BLOCK_D, EVEN_HEADS)
    t = t.to(tl.int64)
    gather_one(key_cache_ptr, kc_stride_block, kc_stride_offset, kc_stride_head, kc_stride_d, out_key_ptr,
               ok_stride_token, ok_stride_head, ok_stride_d, t, block, offset, heads, d, mask, k_scale, FP8, ALIGN)
    gather_one(value_cache_ptr, vc_stride_block, vc_stride_offset, vc_stride_head, vc_stride_d, out_value_ptr,
               ov_stride_token, ov_stride_head, ov_stride_d, t, block, offset, heads, d, mask, v_scale, FP8, ALIGN)


gather_tokens, gather_tokens_unaligned = aligned_and_unaligned(_gather_tokens, GATHER_INTEGERS,
                                                               GATHER_DATA_POINTERS)
