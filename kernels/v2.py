"""docs/contract.md §10 (vLLM's V2 block tables) as Triton kernels: apply the staged row
writes, gather rows into batch order, map every group's slots. The checked entry
points are in blocktable.v2; these kernels trust their arguments, except that they
never touch memory outside the tables: a group, row or column outside them is
skipped (the host checks reject one first).

Per-group tensors reach a kernel through a pointer table, as in vLLM: one int64 per
group holding `data_ptr()`, loaded and cast with `.to(tl.pointer_type(tl.int32))`,
beside per-group strides, widths and sizes (each an int64 vector of G entries,
rows of one small table the wrapper uploads). This runs unchanged under the
interpreter, where a CPU tensor's `data_ptr()` is a host address the interpreter
reads and writes directly.

Every row offset is int64 (`r * stride` passes 2**31 once a table holds more than
2**31 entries: vLLM #57030), and so is every slot product (block ids up to 2**31-1
times B). Two habits for Triton 3.9's interpreter: no `~` on booleans, and no scalar
condition (`r >= 0`) combined into a vector mask, since the interpreter turns either
into an int32 array that it then refuses as a mask. Scalar conditions act through a
scalar `if` or by emptying a range (`tl.where(ok, n, 0)`) instead.

The interpreter does not type-check: a name bound in both branches of an `if` must
have one type in both for the compiler, which only a GPU run shows.

Grids:
- append: one program per staged write, then one per TILE counts of the `[G, Rmax]`
  count copy. A write that a later write to the same row overlaps leaves the
  overlapped columns alone, so the later write wins whatever order programs run in.
  Each program scans the later writes a tile at a time for its row (one vector
  compare per TILE writes); only a row written twice pays a per-write loop.
- gather: (batch position b < num_reqs_padded, group).
- slot mappings: (request b <= N, group); program N writes the -1 pad from
  T = qsl[N] (from 0 for a disabled group). Each request loops over its tokens in
  tiles of TILE.
"""

import triton
import triton.language as tl

# Run-time integers that vary from call to call: left unspecialized, so that one
# compilation serves every call (Triton would otherwise compile for values of 1 and
# multiples of 16).
APPEND_INTS = ["num_groups", "num_rows", "num_writes", "cnt_s0", "cnt_s1", "dev_s0", "dev_s1"]
GATHER_INTS = ["num_rows", "cnt_s0", "cnt_s1", "num_reqs"]
SLOT_INTS = ["slots_s0", "slots_s1", "num_reqs", "max_num_tokens", "W", "R", "I"]
# Pointers whose 16-byte alignment Triton would otherwise compile for, each doubling the
# compilations a fuzzing run needs (a group table's rows and the staged arrays sit at
# offsets that vary with the group count). These kernels gain nothing from it: every
# access goes through an index or stride the compiler cannot see, so nothing vectorizes.
APPEND_POINTERS = ["row_ptrs", "row_strides", "widths", "group_ptr", "row_ptr", "start_ptr", "ids_ptr", "cu_ptr",
                   "cnt_ptr", "dev_ptr"]
GATHER_POINTERS = ["row_ptrs", "row_strides", "row_widths", "inp_ptrs", "inp_strides", "inp_widths", "cnt_ptr",
                   "idx_ptr"]
SLOT_POINTERS = ["row_ptrs", "row_strides", "widths", "kv_blocks", "kernel_blocks", "sharded", "enabled", "idx_ptr",
                 "qsl_ptr", "pos_ptr", "slots_ptr"]


@triton.jit
def int32_rows(ptrs, g):
    """Group g's table as an int32 pointer, from the pointer table."""
    return tl.load(ptrs + g).to(tl.pointer_type(tl.int32))


@triton.jit(do_not_specialize=APPEND_INTS, do_not_specialize_on_alignment=APPEND_POINTERS)
def append_block_ids(row_ptrs, row_strides, widths, num_groups, num_rows,
                     group_ptr, row_ptr, start_ptr, ids_ptr, cu_ptr, num_writes,
                     cnt_ptr, cnt_s0, cnt_s1, dev_ptr, dev_s0, dev_s1,
                     TILE: tl.constexpr, COLS: tl.constexpr):
    """Program i < num_writes: rows[g_i][r_i, start_i : start_i + len_i] = ids[cu_i : cu_i+1],
    except columns a later write j > i to the same row also covers. Programs past
    the writes: cnt_dev = cnt, TILE entries each."""
    pid = tl.program_id(0)
    if pid >= num_writes:
        # Names of their own: a name bound in both branches must have one type there.
        k = (pid - num_writes).to(tl.int64) * TILE + tl.arange(0, TILE)
        in_counts = k < num_groups * num_rows
        kg = k // num_rows
        kr = k - kg * num_rows
        counts = tl.load(cnt_ptr + kg * cnt_s0 + kr * cnt_s1, mask=in_counts)
        tl.store(dev_ptr + kg * dev_s0 + kr * dev_s1, counts, mask=in_counts)
    else:
        g = tl.load(group_ptr + pid)
        r = tl.load(row_ptr + pid).to(tl.int64)
        start = tl.load(start_ptr + pid)
        first = tl.load(cu_ptr + pid)
        n = tl.load(cu_ptr + pid + 1) - first
        inside = (g >= 0) & (g < num_groups) & (r >= 0) & (r < num_rows) & (start >= 0)
        gs = tl.where(inside, g, 0)
        n = tl.where(inside, n, 0)  # a write outside the tables writes nothing
        width = tl.load(widths + gs)
        # The first and last later write to the same row, found a tile of writes at a
        # time: nearly always there is none, and the column-by-column test below
        # loops over that span only.
        first_later = tl.full([], 0, tl.int32) + num_writes
        last_later = tl.full([], -1, tl.int32)
        for j0 in range(pid + 1, num_writes, TILE):
            j = j0 + tl.arange(0, TILE)
            mj = j < num_writes
            gj = tl.load(group_ptr + j, mask=mj, other=-1)
            rj = tl.load(row_ptr + j, mask=mj, other=-1)
            same = (gj == g) & (rj == r)
            first_later = tl.minimum(first_later, tl.min(tl.where(same, j, num_writes)))
            last_later = tl.maximum(last_later, tl.max(tl.where(same, j, -1)))
        dst = int32_rows(row_ptrs, gs) + r * tl.load(row_strides + gs)
        for c0 in range(0, n, COLS):
            offs = c0 + tl.arange(0, COLS)
            col = start + offs
            keep = (offs < n) & (col < width)
            if last_later >= 0:
                for j in range(first_later, last_later + 1):
                    if (tl.load(group_ptr + j) == g) & (tl.load(row_ptr + j) == r):
                        sj = tl.load(start_ptr + j)
                        ej = sj + tl.load(cu_ptr + j + 1) - tl.load(cu_ptr + j)
                        keep = keep & ((col < sj) | (col >= ej))
            ids = tl.load(ids_ptr + first + offs, mask=keep)
            tl.store(dst + col, ids, mask=keep)


@triton.jit(do_not_specialize=GATHER_INTS, do_not_specialize_on_alignment=GATHER_POINTERS)
def gather_block_tables(row_ptrs, row_strides, row_widths, inp_ptrs, inp_strides, inp_widths, num_rows,
                        cnt_ptr, cnt_s0, cnt_s1, idx_ptr, num_reqs, COLS: tl.constexpr):
    """inp[g][b, :n] = rows[g][r, :n] with r = idx[b], n = cnt_dev[g, r] (the rest of the
    row unchanged); a dummy (r = -1) or padding position (b >= N) zeroes the row."""
    b = tl.program_id(0)
    g = tl.program_id(1)
    inp_width = tl.load(inp_widths + g)
    dst = int32_rows(inp_ptrs, g) + b.to(tl.int64) * tl.load(inp_strides + g)
    r = tl.load(idx_ptr + b, mask=b < num_reqs, other=-1).to(tl.int64)
    if (r >= 0) & (r < num_rows):
        n = tl.load(cnt_ptr + g * cnt_s0 + r * cnt_s1)
        n = tl.maximum(tl.minimum(tl.minimum(n, tl.load(row_widths + g)), inp_width), 0)
        src = int32_rows(row_ptrs, g) + r * tl.load(row_strides + g)
        for c0 in range(0, n, COLS):
            offs = c0 + tl.arange(0, COLS)
            m = offs < n
            tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)
    else:
        for c0 in range(0, inp_width, COLS):
            offs = c0 + tl.arange(0, COLS)
            tl.store(dst + offs, tl.zeros([COLS], tl.int32), mask=offs < inp_width)


@triton.jit
def token_slots(p, valid, row, width, K, B, dcp, W, R, I):
    """(slot, keep) of int64 positions p in a row: §10.7's ownership in allocation-block
    coordinates when dcp, else every token local with l = p. keep is False where
    `valid` is, so such lanes read nothing. Offsets inside one virtual block
    (K * W tokens) fit in int32, where division is cheap."""
    if dcp:
        vb = K * W
        vbi = p // vb
        vbo = (p - vbi * vb).to(tl.int32)
        local = ((vbo // I) % W) == R
        lofs = (vbo // (W * I)) * I + vbo % I  # l = vbi*K + lofs, lofs < K = P*B
        col = vbi * (K // B) + lofs // B
        offset = (lofs % B).to(tl.int64)
    else:
        local = p >= 0
        col = p // B
        offset = p - col * B
    keep = valid & local & (col >= 0) & (col < width)
    block = tl.load(row + col, mask=keep, other=0).to(tl.int64)
    return block * B + offset, keep


@triton.jit(do_not_specialize=SLOT_INTS, do_not_specialize_on_alignment=SLOT_POINTERS)
def compute_slot_mappings(row_ptrs, row_strides, widths, kv_blocks, kernel_blocks, sharded, enabled,
                          idx_ptr, qsl_ptr, pos_ptr, slots_ptr, slots_s0, slots_s1,
                          num_reqs, max_num_tokens, W, R, I, TILE: tl.constexpr):
    """slots[g, t] for every group g and t < Tmax: request b's tokens [qsl[b], qsl[b+1])
    through row idx[b] of rows[g]; -1 for a dummy row, a token another rank owns, a
    column past the row, a disabled group, and t >= T."""
    b = tl.program_id(0)
    g = tl.program_id(1)
    out = slots_ptr + g.to(tl.int64) * slots_s0
    on = tl.load(enabled + g) != 0
    if b == num_reqs:
        pad_from = tl.where(on, tl.load(qsl_ptr + num_reqs), 0).to(tl.int64)
        for t0 in range(pad_from, max_num_tokens, TILE):
            t = t0 + tl.arange(0, TILE)
            tl.store(out + t * slots_s1, tl.full([TILE], -1, tl.int64), mask=t < max_num_tokens)
    elif on:
        r = tl.load(idx_ptr + b).to(tl.int64)
        begin = tl.load(qsl_ptr + b).to(tl.int64)
        end = tl.minimum(tl.load(qsl_ptr + b + 1).to(tl.int64), max_num_tokens)
        width = tl.where(r >= 0, tl.load(widths + g), 0)  # a dummy row has no columns: all -1
        K = tl.load(kv_blocks + g)
        B = tl.load(kernel_blocks + g)
        dcp = (tl.load(sharded + g) != 0) & (W > 1)
        row = int32_rows(row_ptrs, g) + tl.maximum(r, 0) * tl.load(row_strides + g)
        for t0 in range(begin, end, TILE):
            t = t0 + tl.arange(0, TILE)
            m = t < end
            p = tl.load(pos_ptr + t, mask=m, other=0)
            slot, keep = token_slots(p, m, row, width, K, B, dcp, W, R, I)
            tl.store(out + t * slots_s1, tl.where(keep, slot, -1), mask=m)
