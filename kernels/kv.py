"""docs/contract.md §9 as Triton kernels: write tokens into paged KV caches, copy blocks,
gather tokens back through a block table. The checked entry points are in
blocktable.kv; these kernels trust their arguments, except that they never touch
memory outside the caches: a slot or block id outside them is skipped (the host
checks reject one first, unless switched off).

How they address memory: every cache is reached through four strides passed as
arguments, (block, offset in block, head, element of D), in that order whatever the
layout: the wrapper permutes the tensor's strides for "HND". So one kernel serves
both layouts and any strides (two caches that are views of one tensor included), and
a contiguous cache still gets its unit stride and 16-divisible strides specialized
by Triton, which is what vectorizes the loads and stores along D. Sizes (token, slot,
block and request counts, the block size, the head count) are left unspecialized:
they vectorize nothing, and each of their values of 1 or multiples of 16 would be one
more compilation, which a fuzzing run, meeting every size, pays on first use. Block
ids, token indices and heads are widened to int64 before they multiply a stride (a
block id times a block's stride passes 2**31 in large caches); divisions stay in
int32 where the values fit (a 64-bit division is a call to a long subroutine on a
GPU).

The grids: write and gather run one program per (tile of TOKENS tokens, group of
HEADS heads), each moving a [TOKENS, HEADS, D] tile of the key and of the value (the
head size is a compile-time constant, padded to a power of two BLOCK_D). A token's
own work (its slot, or its request and block) is done once for all the heads of its
program: on a GPU that per-token work, repeated per head, cost more than the fp8
arithmetic. Copy runs one program per (pair, tile of ROWS rows of a block), a row
being the innermost dimension. No kernel loops over a run-time bound.

"auto" moves bits: the wrapper views float caches and tensors as integers of the
same width, so no value is converted (NaN payloads included). fp8 e4m3fn: round to
nearest even, ±448 beyond the range (infinities too), every NaN 0x7F. Two encoders
give those codes: on GPUs with fp8 conversion (compute capability 8.9 and up) the
hardware's `cvt.rn.satfinite.e4m3x2.f32`, four values to an instruction pair, behind a
clamp that decides saturation and NaN first (so no rule rests on what the
conversion does at the edges); elsewhere, and in the interpreter, integer operations
on float32 bits. Decoding is always integer arithmetic. With fp8 the write is bound by
instructions rather than bytes on an H200, so the division is done in three
operations (see `quantize`) and the encoder is kept short.
"""

import triton
import triton.language as tl

# Modes of `write_tokens`: a bit copy, or fp8 from the key's float type.
WRITE_MODES = ("copy", "fp8_from_float16", "fp8_from_bfloat16", "fp8_from_float32")

# Left unspecialized (see above): the sizes, and the gather's block-table row stride,
# which only addresses a gather of single block ids and so vectorizes nothing either.
WRITE_SIZES = ["num_tokens", "num_slots", "block_size", "num_heads"]
COPY_SIZES = ["num_blocks", "rows", "size_2"]
GATHER_SIZES = ["table_stride_0", "num_reqs", "num_blocks", "block_size", "width", "out_rows", "num_heads"]

FLOAT32_2_POW_MINUS_6 = tl.constexpr(0x3C800000)  # the smallest normal e4m3 value, as float32 bits
FLOAT32_INF = tl.constexpr(0x7F800000)
FLOAT32_NAN = tl.constexpr(0x7FC00000)  # what a NaN code decodes to (with its sign)
FLOAT32_2_POW_14 = tl.constexpr(0x46800000)


@triton.jit
def e4m3_magnitude(q):
    """e4m3 codes 0..0x7E of float32 magnitudes `q` (>= 0, any NaN taken as 448):
    round to nearest even, 448 and beyond (infinity too) to 0x7E."""
    # minimum(NaN, 448) is 448 on a GPU and in the interpreter alike (IEEE minNum).
    a = tl.minimum(q, 448.0).to(tl.int32, bitcast=True)
    # Normal results: rebias the exponent (127 -> 7) and keep 3 of the 23 mantissa
    # bits, adding just under half of the dropped part plus the kept part's last bit
    # (ties to even); a carry runs into the exponent, as it should.
    normal = (a + (0x7FFFF - (120 << 23)) + ((a >> 20) & 1)) >> 20
    # Subnormal results m * 2**-9 (below 2**-6): in 2**14 + q the float32 ulp is 2**-9,
    # so the hardware's round-to-nearest-even addition leaves m in the low bits (m = 8,
    # the code of 2**-6, when it rounds up across the boundary).
    subnormal = (a.to(tl.float32, bitcast=True) + 16384.0).to(tl.int32, bitcast=True) - FLOAT32_2_POW_14
    return tl.where(a < FLOAT32_2_POW_MINUS_6, subnormal, normal)


@triton.jit
def e4m3_encode(x):
    """int32 e4m3fn codes (0..255) of float32 `x`: the sign kept, every NaN 0x7F."""
    bits = x.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    code = e4m3_magnitude(a.to(tl.float32, bitcast=True)) | ((bits >> 24) & 0x80)
    return tl.where(a > FLOAT32_INF, 0x7F, code)


@triton.jit
def e4m3_convert(q):
    """uint8 e4m3fn codes of float32 `q` by the GPU's conversion: round to nearest
    even, saturating at ±448. `cvt...e4m3x2` packs two codes into 16 bits, its first
    operand in the high byte; four codes make one 32-bit result."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b16 lo, hi;
        cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;
        cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;
        mov.b32 $0, {lo, hi};
        }""",
        constraints="=r,r,r,r,r", args=[q.to(tl.int32, bitcast=True)], dtype=tl.uint8, is_pure=True, pack=4)


@triton.jit
def divide(x, scale, reciprocal, EXACT_DIVISION: tl.constexpr):
    """float32 x / scale, correctly rounded, the sign of zero kept. Unless
    EXACT_DIVISION (IEEE division: a dozen instructions and a slow-path branch),
    Markstein's division in three: q0 = x * r with r = RN(1 / scale) from the host,
    the residual q0 * scale - x (exact in an fma), and q0 corrected by -residual * r in
    one more fma, which gives the rounded quotient when nothing under- or overflows.
    (The residual is negated rather than taken as x - q0 * scale so that x = -0 gives
    -0: -0 + +0 is +0. And negated by multiplying by -1: Triton's unary minus is 0 - x,
    which makes +0 of -0 too.) The host takes this path only for scales in [2**-64, 2**64],
    so every quotient that can round to a nonzero code (2**-11 and up) comes from
    normal numbers, and smaller ones encode to a zero even if off by an ulp."""
    if EXACT_DIVISION:
        q = tl.math.div_rn(x, scale)
    else:
        q0 = x * reciprocal
        q = tl.fma(tl.fma(q0, scale, x * -1.0) * -1.0, reciprocal, q0)
    return q


@triton.jit
def quantize(x, scale, reciprocal, EXACT_DIVISION: tl.constexpr, HARDWARE_FP8: tl.constexpr):
    """uint8 e4m3fn codes of float32 x / scale, the quotient correctly rounded (see
    `divide`); every NaN gives 0x7F, whatever its sign.

    HARDWARE_FP8: the GPU converts. Saturation is decided before it: the fast division
    takes x clamped to ±448 * scale (a quotient near the float32 maximum, or infinite,
    would make its residual NaN), the IEEE one clamps its quotient to ±448, both
    keeping NaN as NaN; a NaN reaching the conversion is the GPU's canonical NaN
    (positive: arithmetic on a NaN does not keep its sign), which gives 0x7F.

    Otherwise the integer encoder, on |x| (the sign is x's, scale > 0, put back on
    the code), where a quotient too large for the residual comes out infinite or NaN
    and both saturate to 448."""
    if HARDWARE_FP8:
        if EXACT_DIVISION:
            q = tl.clamp(divide(x, scale, reciprocal, EXACT_DIVISION), -448.0, 448.0,
                         propagate_nan=tl.PropagateNan.ALL)
        else:
            limit = 448.0 * scale
            q = divide(tl.clamp(x, -limit, limit, propagate_nan=tl.PropagateNan.ALL), scale, reciprocal,
                       EXACT_DIVISION)
        codes = e4m3_convert(q)
    else:
        bits = x.to(tl.int32, bitcast=True)
        magnitude = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
        code = e4m3_magnitude(divide(magnitude, scale, reciprocal, EXACT_DIVISION)) | ((bits >> 24) & 0x80)
        codes = tl.where((bits & 0x7FFFFFFF) > FLOAT32_INF, 0x7F, code).to(tl.uint8)
    return codes


@triton.jit
def e4m3_decode(code, scale):
    """float32 decode(code) * scale for int32 codes; a NaN code gives the quiet NaN
    with its sign, never a product (whose NaN bits differ between devices)."""
    sign = (code & 0x80) << 24
    # The code's 7 bits moved to the top of a float32's exponent and mantissa make a
    # float 2**-120 times the code's value (subnormal codes land on float32
    # subnormals, which Triton's multiply keeps); scaling by 2**120 is exact.
    magnitude = ((code & 0x7F) << 20).to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2**120
    value = (magnitude.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True) * scale
    nan = (sign | FLOAT32_NAN).to(tl.float32, bitcast=True)
    return tl.where((code & 0x7F) == 0x7F, nan, value)


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
def write_one(src_ptr, src_stride_token, src_stride_head, src_stride_d, cache_ptr, stride_block, stride_offset,
              stride_head, stride_d, t, block, offset, heads, d, mask, scale, reciprocal, MODE: tl.constexpr,
              EXACT_DIVISION: tl.constexpr, HARDWARE_FP8: tl.constexpr):
    src = (t * src_stride_token)[:, None, None] + (heads * src_stride_head)[None, :, None] \
        + (d * src_stride_d)[None, None, :]
    x = tl.load(src_ptr + src, mask=mask)
    place = (block * stride_block + offset * stride_offset)[:, None, None] + (heads * stride_head)[None, :, None] \
        + (d * stride_d)[None, None, :]
    tl.store(cache_ptr + place, to_cache(x, scale, reciprocal, MODE, EXACT_DIVISION, HARDWARE_FP8), mask=mask)


@triton.jit(do_not_specialize=WRITE_SIZES)
def write_tokens(key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr, slot_stride,
                 num_tokens, num_slots, block_size, num_heads,
                 key_stride_token, key_stride_head, key_stride_d,
                 value_stride_token, value_stride_head, value_stride_d,
                 kc_stride_block, kc_stride_offset, kc_stride_head, kc_stride_d,
                 vc_stride_block, vc_stride_offset, vc_stride_head, vc_stride_d,
                 k_scale, k_reciprocal, v_scale, v_reciprocal,
                 HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, TOKENS: tl.constexpr, HEADS: tl.constexpr,
                 EVEN_HEADS: tl.constexpr, MODE: tl.constexpr, EXACT_DIVISION: tl.constexpr,
                 HARDWARE_FP8: tl.constexpr, SLOTS_INT32: tl.constexpr):
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
              MODE, EXACT_DIVISION, HARDWARE_FP8)
    write_one(value_ptr, value_stride_token, value_stride_head, value_stride_d, value_cache_ptr, vc_stride_block,
              vc_stride_offset, vc_stride_head, vc_stride_d, t, block, offset, heads, d, mask, v_scale, v_reciprocal,
              MODE, EXACT_DIVISION, HARDWARE_FP8)


@triton.jit
def copy_one(cache_ptr, src, dst, stride_block, stride_1, stride_2, stride_3, i1, i2, c, mask):
    inside = i1[:, None] * stride_1 + i2[:, None] * stride_2 + c[None, :] * stride_3
    x = tl.load(cache_ptr + src * stride_block + inside, mask=mask)
    tl.store(cache_ptr + dst * stride_block + inside, x, mask=mask)


@triton.jit(do_not_specialize=COPY_SIZES)
def copy_blocks(key_cache_ptr, value_cache_ptr, pairs_ptr, pairs_stride_0, pairs_stride_1, num_blocks,
                rows, size_2,
                kc_stride_0, kc_stride_1, kc_stride_2, kc_stride_3,
                vc_stride_0, vc_stride_1, vc_stride_2, vc_stride_3,
                INNER: tl.constexpr, BLOCK_INNER: tl.constexpr, ROWS: tl.constexpr):
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
    copy_one(key_cache_ptr, src, dst, kc_stride_0, kc_stride_1, kc_stride_2, kc_stride_3, i1, i2, c, mask)
    copy_one(value_cache_ptr, src, dst, vc_stride_0, vc_stride_1, vc_stride_2, vc_stride_3, i1, i2, c, mask)


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
               out_stride_head, out_stride_d, t, block, offset, heads, d, mask, scale, FP8: tl.constexpr):
    place = (block * stride_block + offset * stride_offset)[:, None, None] + (heads * stride_head)[None, :, None]
    if FP8:
        # The same offsets, but seen by the compiler as runs of 4: then the one-byte
        # codes are loaded 4 to a thread, as the float32 results are stored, and no
        # layout conversion through shared memory sits between the two.
        d_codes = (d // 4) * 4 + d % 4
        codes = tl.load(cache_ptr + place + (d_codes * stride_d)[None, None, :], mask=mask)
        x = e4m3_decode(codes.to(tl.int32), scale)
    else:
        x = tl.load(cache_ptr + place + (d * stride_d)[None, None, :], mask=mask)
    out = (t * out_stride_token)[:, None, None] + (heads * out_stride_head)[None, :, None] \
        + (d * out_stride_d)[None, None, :]
    tl.store(out_ptr + out, x, mask=mask)


@triton.jit(do_not_specialize=GATHER_SIZES)
def gather_tokens(key_cache_ptr, value_cache_ptr, table_ptr, table_stride_0, table_stride_1, cu_ptr,
                  out_key_ptr, out_value_ptr, num_reqs, num_blocks, block_size, width, out_rows, num_heads,
                  kc_stride_block, kc_stride_offset, kc_stride_head, kc_stride_d,
                  vc_stride_block, vc_stride_offset, vc_stride_head, vc_stride_d,
                  ok_stride_token, ok_stride_head, ok_stride_d,
                  ov_stride_token, ov_stride_head, ov_stride_d,
                  k_scale, v_scale,
                  HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, TOKENS: tl.constexpr, HEADS: tl.constexpr,
                  EVEN_HEADS: tl.constexpr, SEARCH_STEPS: tl.constexpr, FP8: tl.constexpr):
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
               ok_stride_token, ok_stride_head, ok_stride_d, t, block, offset, heads, d, mask, k_scale, FP8)
    gather_one(value_cache_ptr, vc_stride_block, vc_stride_offset, vc_stride_head, vc_stride_d, out_value_ptr,
               ov_stride_token, ov_stride_head, ov_stride_d, t, block, offset, heads, d, mask, v_scale, FP8)
