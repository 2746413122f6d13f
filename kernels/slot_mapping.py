"""docs/contract.md §4 as Triton kernels: the slot of every scheduled token, -1 where the token
is not this rank's or its table column lies past the row, and -1 over the tail.

`slot_mapping_per_request` is the design vLLM's V1 runner ships
(`_compute_slot_mapping_kernel`), with vLLM's compile-time choices: one program per
request looping over 1,024-token tiles, one extra program for the tail; the
allocation block size K, the DCP world size, rank and interleave, the pad value and
the tile are compile-time constants, the kernel block size B and the table stride
run-time arguments under Triton's default integer specialization, the token counts
not specialized, the request bounds widened to int64. It is the baseline the
benchmark compares with. Beside vLLM's it adds only the contract's out-of-row guard
and an int64 row offset.
`slot_mapping_tiled` is a grid over token tiles, the default;
`slot_mapping_tiled_specialized` compiles K, B, W and I in.

Positions are int64, and block ids are widened before the multiply so that ids up
to 2**31-1 times B cannot wrap. Inside a virtual block (K * W tokens) offsets fit
in int32, where division is far cheaper than in int64. The tiled kernels' integer
arguments are not specialized: fuzzing draws many configurations, and each
specialization compiles. So that one compilation is also fast, the run-time kernel
divides by multiplying: the host gives each divisor d its multiplier
m = ceil(2**s / d), s = 31 + ceil(log2 d), and n // d = (n * m) >> s for every
0 <= n < 2**31 (Granlund and Montgomery's bound, since m * d - 2**s < d <= 2**(s-31)).
Positions are first clamped to a limit past which every column lies outside the
row, so that they fit in 31 bits; a row that maps 2**31 positions or more takes
the plain divisions instead (a second compilation, never a wrong answer).
"""

import triton
import triton.language as tl

SIZES = ["table_stride", "num_reqs", "num_tokens", "max_num_tokens", "width", "R"]
DIVISORS = ["K", "B", "W", "I", "limit", "m_vb", "s_vb", "m_i", "s_i", "m_w", "s_w", "m_b", "s_b"]
RUNTIME_INTS = SIZES + DIVISORS


@triton.jit
def token_slots(p, valid, row_ptr, width, K, B, W, R, I, limit, m_vb, s_vb, m_i, s_i, m_w, s_w, m_b, s_b,
                MAGIC: tl.constexpr, NARROW: tl.constexpr):
    """(slot, keep) for int64 positions `p` of the request whose row starts at row_ptr.
    keep is False where the lane holds no token (`valid` False), the token is not this
    rank's, or its column is past the row; such lanes read nothing, since for an empty
    batch even row 0 of the table may not exist. With MAGIC, (m_x, s_x) divide by the
    virtual block, I, W and B, and `limit` is a position past the row. Without it the
    division is plain, in int32 after the virtual block where NARROW (K * W < 2**31 is
    known when compiling: the specialized kernel's sizes), in int64 where it is not."""
    P = K // B
    # Interleave chunks of I tokens are dealt to the ranks in turn; `rounds` counts whole
    # deals. The multiplies are written out, not called: under the interpreter every
    # call of a jit function costs more than the arithmetic.
    if MAGIC:
        vb = K * W  # one virtual block: K tokens on each of W ranks (below 2**31 with MAGIC)
        n = tl.minimum(p, limit).to(tl.int32)  # past `limit` every column is past the row
        vbi = ((n.to(tl.int64) * m_vb) >> s_vb).to(tl.int32)
        vbo = n - vbi * vb
        chunk = ((vbo.to(tl.int64) * m_i) >> s_i).to(tl.int32)
        rounds = ((chunk.to(tl.int64) * m_w) >> s_w).to(tl.int32)
    elif NARROW:
        vb = K * W
        vbi = p // vb
        vbo = (p - vbi * vb).to(tl.int32)
        chunk = vbo // I
        rounds = chunk // W
    else:
        # A virtual block may pass 2**31 positions: K * W, and the offset inside the
        # block, may not fit int32 (wrapped, they once read before or past the row).
        vb = tl.cast(K, tl.int64) * W
        vbi = p // vb
        vbo = p - vbi * vb
        chunk = vbo // I
        rounds = chunk // W
    local = (chunk - rounds * W) == R  # ownership in allocation-block coordinates
    lofs = rounds * I + (vbo - chunk * I)  # offset inside this rank's K slots
    if MAGIC:
        kb = ((lofs.to(tl.int64) * m_b) >> s_b).to(tl.int32)
    else:
        kb = lofs // B
    col = vbi * P + kb
    keep = valid & local & (col < width)
    block = tl.load(row_ptr + col, mask=keep, other=0).to(tl.int64)
    return block * B + (lofs - kb * B), keep


@triton.jit(do_not_specialize=["num_tokens", "max_num_tokens"])
def slot_mapping_per_request(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr, num_tokens, max_num_tokens, width,
                             B, K: tl.constexpr, P: tl.constexpr, W: tl.constexpr, R: tl.constexpr,
                             I: tl.constexpr, BLOCK: tl.constexpr, PAD: tl.constexpr = -1):
    """vLLM's kernel, step for step: K, P = K / B, W, R, I, the pad value PAD and the
    tile BLOCK (1,024 tokens) compiled in; B and the stride run-time, as vLLM's
    block_size is; its int64 arithmetic on positions. The one addition is the
    contract's out-of-row guard (`col < width`), which vLLM's kernel lacks."""
    req = tl.program_id(0)
    if req == tl.num_programs(0) - 1:
        # The last program pads [num_tokens, max_num_tokens) with PAD.
        for tail in range(num_tokens, max_num_tokens, BLOCK):
            pad = tail + tl.arange(0, BLOCK)
            tl.store(out_ptr + pad, tl.full([BLOCK], PAD, tl.int64), mask=pad < max_num_tokens)
        # Returning here, as vLLM's kernel does, keeps the request loop at the kernel's top
        # level: nested in an else, it measured up to 1.3x slower on an H200.
        return
    begin = tl.load(qsl_ptr + req).to(tl.int64)
    end = tl.load(qsl_ptr + req + 1).to(tl.int64)
    row_ptr = table_ptr + req.to(tl.int64) * table_stride
    for start in range(begin, end, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_req = offs < end
        p = tl.load(pos_ptr + offs, mask=in_req, other=0)
        vbi = p // (K * W)
        vbo = p - vbi * (K * W)
        local = (vbo // (W * I)) * I + vbo % I
        col = vbi * P + local // B
        mine = ((vbo // I) % W == R) & (col < width)  # vLLM's is_local, and the out-of-row guard
        block = tl.load(row_ptr + col, mask=in_req & mine, other=0).to(tl.int64)
        tl.store(out_ptr + offs, tl.where(mine, block * B + local % B, PAD), mask=in_req)


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
def decode_requests(qsl_ptr, t, valid, num_reqs, SEARCH_STEPS: tl.constexpr):
    """Each token's request where the batch has no more tokens than requests (decode):
    token t is then usually request t, and two loads per lane check that for the
    whole tile at once. Only a tile where some lane's guess fails pays the search."""
    guess = tl.minimum(t, num_reqs - 1).to(tl.int32)
    lo = tl.load(qsl_ptr + guess, mask=valid, other=0)
    hi = tl.load(qsl_ptr + guess + 1, mask=valid, other=0)
    hit = ~valid | ((lo <= t) & (t < hi))
    if tl.min(hit.to(tl.int32), axis=0) == 1:
        req = guess
    else:
        req = token_requests(qsl_ptr, t, valid, num_reqs, SEARCH_STEPS)
    return req


@triton.jit
def first_request(qsl_ptr, first, num_reqs, SEARCH_STEPS: tl.constexpr):
    """The request of the tile's first token (`first` < num_tokens). Up to 1,024
    requests: how many of qsl[1..N] are <= first, by one vector load and a sum (the
    requests before it end at or before it), where a search would wait on one load
    per halving. Beyond, the same search as token_requests, in scalars."""
    if SEARCH_STEPS == 0:  # one request
        r = 0
    elif SEARCH_STEPS <= 10:
        i = tl.arange(0, 1 << SEARCH_STEPS)
        ends = tl.load(qsl_ptr + 1 + i, mask=i < num_reqs - 1, other=0)
        r = tl.sum(((i < num_reqs - 1) & (ends <= first)).to(tl.int32), axis=0)
    else:
        r = 0
        size = num_reqs
        for _ in tl.static_range(SEARCH_STEPS):
            half = size // 2
            r = tl.where(tl.load(qsl_ptr + r + half) <= first, r + half, r)
            size -= half
    return r


@triton.jit
def tiled_body(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr, num_reqs, num_tokens, max_num_tokens, width,
               K, B, W, R, I, limit, m_vb, s_vb, m_i, s_i, m_w, s_w, m_b, s_b, MAGIC: tl.constexpr,
               SEARCH_STEPS: tl.constexpr, BLOCK: tl.constexpr, WHOLE_TILES: tl.constexpr, DECODE: tl.constexpr,
               NARROW: tl.constexpr):
    """Map BLOCK consecutive output slots, tail included.

    A tile of scheduled tokens only is loaded and stored without masks (a mask whose
    bound is a run-time value keeps Triton from vectorizing), streaming past the
    caches. With WHOLE_TILES (chosen where requests average a tile or more, so most
    tiles lie inside one request) one scalar search finds the tile's first request,
    and a tile that request covers skips the per-token search. With DECODE (no more
    tokens than requests) a tile first tries token t as request t. Other tiles search
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
        elif DECODE:
            req = decode_requests(qsl_ptr, t, every, num_reqs, SEARCH_STEPS)
        else:
            req = token_requests(qsl_ptr, t, every, num_reqs, SEARCH_STEPS)
        slot, keep = token_slots(p, every, table_ptr + req.to(tl.int64) * table_stride, width, K, B, W, R, I,
                                 limit, m_vb, s_vb, m_i, s_i, m_w, s_w, m_b, s_b, MAGIC, NARROW)
        tl.store(out_ptr + t, tl.where(keep, slot, -1), cache_modifier=".cs")
    else:
        is_token = t < num_tokens
        if DECODE:
            req = decode_requests(qsl_ptr, t, is_token, num_reqs, SEARCH_STEPS)
        else:
            req = token_requests(qsl_ptr, t, is_token, num_reqs, SEARCH_STEPS)
        p = tl.load(pos_ptr + t, mask=is_token, other=0)
        slot, keep = token_slots(p, is_token, table_ptr + req.to(tl.int64) * table_stride, width, K, B, W, R, I,
                                 limit, m_vb, s_vb, m_i, s_i, m_w, s_w, m_b, s_b, MAGIC, NARROW)
        tl.store(out_ptr + t, tl.where(keep, slot, -1), mask=t < max_num_tokens)


@triton.jit(do_not_specialize=RUNTIME_INTS)
def slot_mapping_tiled(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr,
                       num_reqs, num_tokens, max_num_tokens, width, K, B, W, R, I,
                       limit, m_vb, s_vb, m_i, s_i, m_w, s_w, m_b, s_b, MAGIC: tl.constexpr,
                       SEARCH_STEPS: tl.constexpr, BLOCK: tl.constexpr, WHOLE_TILES: tl.constexpr,
                       DECODE: tl.constexpr):
    """A grid over token tiles, so one long prefill spreads over many SMs; every
    size is a run-time argument, and with MAGIC every division a multiply (one
    compilation serves every configuration)."""
    tiled_body(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr, num_reqs, num_tokens, max_num_tokens, width,
               K, B, W, R, I, limit, m_vb, s_vb, m_i, s_i, m_w, s_w, m_b, s_b, MAGIC, SEARCH_STEPS, BLOCK,
               WHOLE_TILES, DECODE, False)


@triton.jit(do_not_specialize=SIZES)
def slot_mapping_tiled_specialized(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr,
                                   num_reqs, num_tokens, max_num_tokens, width, K: tl.constexpr,
                                   B: tl.constexpr, W: tl.constexpr, R, I: tl.constexpr,
                                   SEARCH_STEPS: tl.constexpr, BLOCK: tl.constexpr, WHOLE_TILES: tl.constexpr,
                                   DECODE: tl.constexpr):
    """The same tiles with K, B, W and I compiled in, as a serving engine's fixed
    block sizes allow: every division and modulo becomes a shift or a multiply.
    One compilation per configuration."""
    tiled_body(qsl_ptr, pos_ptr, table_ptr, table_stride, out_ptr, num_reqs, num_tokens, max_num_tokens, width,
               K, B, W, R, I, 0, 0, 0, 0, 0, 0, 0, 0, 0, False, SEARCH_STEPS, BLOCK, WHOLE_TILES, DECODE,
               K * W < 2147483648)
