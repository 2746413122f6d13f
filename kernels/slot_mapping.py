"""docs/contract.md §4 as Triton kernels: the slot of every scheduled token, -1 where the token
is not this rank's or its table column lies past the row, and -1 over the tail.

`slot_mapping_per_request` is the design vLLM ships, with vLLM's compile-time
choices: one program per request looping over 1,024-token tiles, one extra program
for the tail; the DCP world size, rank and interleave, the pad value and the tile
are compile-time constants, the block sizes run-time arguments, and Triton's default
integer specialization is left on. It is the baseline the benchmark compares with.
`slot_mapping_tiled` is a grid over token tiles, the default;
`slot_mapping_tiled_specialized` compiles K, B, W and I in.

Positions are int64, and block ids are widened before the multiply so that ids up
to 2**31-1 times B cannot wrap. Inside a virtual block (K * W tokens) offsets fit
in int32, where division is far cheaper than in int64. The tiled kernels' integer
arguments are not specialized: fuzzing draws many configurations, and each
specialization compiles.
"""

import triton
import triton.language as tl

RUNTIME_INTS = ["table_stride", "num_reqs", "num_tokens", "max_num_tokens", "width", "K", "B", "W", "R", "I"]


@triton.jit
def token_slots(p, valid, row_ptr, width, K, B, W, R, I):
    """(slot, keep) for int64 positions `p` of the request whose row starts at row_ptr.
    keep is False where the lane holds no token (`valid` False), the token is not this
    rank's, or its column is past the row; such lanes read nothing, since for an empty
    batch even row 0 of the table may not exist."""
    P = K // B
    vb = K * W  # one virtual block: K tokens on each of W ranks
    vbi = p // vb
    vbo = (p - vbi * vb).to(tl.int32)
    local = ((vbo // I) % W) == R  # ownership in allocation-block coordinates
    lofs = (vbo // (W * I)) * I + vbo % I  # offset inside this rank's K slots
    col = vbi * P + lofs // B
    keep = valid & local & (col < width)
    block = tl.load(row_ptr + col, mask=keep, other=0).to(tl.int64)
    return block * B + lofs % B, keep


@triton.jit
def slot_mapping_per_request(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr,
                             num_tokens, max_num_tokens, width, K, B, W: tl.constexpr, R: tl.constexpr,
                             I: tl.constexpr, BLOCK: tl.constexpr, PAD: tl.constexpr = -1):
    """vLLM's kernel shape: W, R, I, the pad value PAD and the tile BLOCK (1,024
    tokens) compiled in, one compilation per DCP rank; K and B run-time."""
    req = tl.program_id(0)
    if req == tl.num_programs(0) - 1:
        # The last program pads [num_tokens, max_num_tokens) with PAD.
        for start in range(num_tokens, max_num_tokens, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, tl.full([BLOCK], PAD, tl.int64), mask=offs < max_num_tokens)
    else:
        begin = tl.load(qsl_ptr + req)
        end = tl.load(qsl_ptr + req + 1)
        row_ptr = table_ptr + req.to(tl.int64) * table_stride
        for start in range(begin, end, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            in_req = offs < end
            p = tl.load(pos_ptr + offs, mask=in_req, other=0)
            slot, keep = token_slots(p, in_req, row_ptr, width, K, B, W, R, I)
            tl.store(out_ptr + offs, tl.where(keep, slot, PAD), mask=in_req)


@triton.jit
def token_requests(qsl_ptr, t, valid, num_reqs, SEARCH_STEPS: tl.constexpr):
    """Each token's request: the last r with qsl[r] <= t, found by a branch-free
    binary search over query_start_loc (SEARCH_STEPS = ceil(log2(N)) halvings)."""
    req = tl.zeros_like(t).to(tl.int32)
    size = num_reqs
    for _ in tl.static_range(SEARCH_STEPS):
        half = size // 2
        start = tl.load(qsl_ptr + req + half, mask=valid, other=0)
        req = tl.where(start <= t, req + half, req)
        size -= half  # the window may stay one wider than needed; it still holds the answer
    return req


@triton.jit
def first_request(qsl_ptr, first, num_reqs, SEARCH_STEPS: tl.constexpr):
    """The same search for one token, in scalars (one load per halving for the tile)."""
    r = 0
    size = num_reqs
    for _ in tl.static_range(SEARCH_STEPS):
        half = size // 2
        r = tl.where(tl.load(qsl_ptr + r + half) <= first, r + half, r)
        size -= half
    return r


@triton.jit
def tiled_body(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr, num_reqs, num_tokens, max_num_tokens, width,
               K, B, W, R, I, SEARCH_STEPS: tl.constexpr, BLOCK: tl.constexpr, WHOLE_TILES: tl.constexpr):
    """Map BLOCK consecutive output slots, tail included.

    A tile of scheduled tokens only is loaded and stored without masks (a mask whose
    bound is a run-time value keeps Triton from vectorizing), streaming past the
    caches. With WHOLE_TILES (chosen where requests average a tile or more, so most
    tiles lie inside one request) one scalar search finds the tile's first request,
    and a tile that request covers skips the per-token search. Other tiles search
    per token."""
    first = tl.program_id(0).to(tl.int64) * BLOCK
    t = first + tl.arange(0, BLOCK)
    if first + BLOCK <= num_tokens:
        every = t >= 0
        p = tl.load(pos_ptr + t, eviction_policy="evict_first")
        if WHOLE_TILES:
            r0 = first_request(qsl_ptr, first, num_reqs, SEARCH_STEPS)
            if tl.load(qsl_ptr + r0 + 1) >= first + BLOCK:
                req = tl.zeros([BLOCK], dtype=tl.int32) + r0
            else:
                req = token_requests(qsl_ptr, t, every, num_reqs, SEARCH_STEPS)
        else:
            req = token_requests(qsl_ptr, t, every, num_reqs, SEARCH_STEPS)
        slot, keep = token_slots(p, every, table_ptr + req.to(tl.int64) * table_stride, width, K, B, W, R, I)
        tl.store(out_ptr + t, tl.where(keep, slot, -1), cache_modifier=".cs")
    else:
        is_token = t < num_tokens
        req = token_requests(qsl_ptr, t, is_token, num_reqs, SEARCH_STEPS)
        p = tl.load(pos_ptr + t, mask=is_token, other=0)
        slot, keep = token_slots(p, is_token, table_ptr + req.to(tl.int64) * table_stride, width, K, B, W, R, I)
        tl.store(out_ptr + t, tl.where(keep, slot, -1), mask=t < max_num_tokens)


@triton.jit(do_not_specialize=RUNTIME_INTS)
def slot_mapping_tiled(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr,
                       num_reqs, num_tokens, max_num_tokens, width, K, B, W, R, I,
                       SEARCH_STEPS: tl.constexpr, BLOCK: tl.constexpr, WHOLE_TILES: tl.constexpr):
    """A grid over token tiles, so one long prefill spreads over many SMs; every
    size is a run-time argument (one compilation serves every configuration)."""
    tiled_body(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr, num_reqs, num_tokens, max_num_tokens, width,
               K, B, W, R, I, SEARCH_STEPS, BLOCK, WHOLE_TILES)


@triton.jit(do_not_specialize=[n for n in RUNTIME_INTS if n not in ("K", "B", "W", "I")])
def slot_mapping_tiled_specialized(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr,
                                   num_reqs, num_tokens, max_num_tokens, width, K: tl.constexpr,
                                   B: tl.constexpr, W: tl.constexpr, R, I: tl.constexpr,
                                   SEARCH_STEPS: tl.constexpr, BLOCK: tl.constexpr, WHOLE_TILES: tl.constexpr):
    """The same tiles with K, B, W and I compiled in, as a serving engine's fixed
    block sizes allow: every division and modulo becomes a shift or a multiply.
    One compilation per configuration."""
    tiled_body(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr, num_reqs, num_tokens, max_num_tokens, width,
               K, B, W, R, I, SEARCH_STEPS, BLOCK, WHOLE_TILES)
