"""The mutation gate's catalogue: small source changes to our own code, each one
imitating a bug that really happens in block-table code. The harness must kill
(detect) every one that can change observable behaviour.

Each mutant replaces one exact snippet (it must occur exactly once) in one file of
the package tree (`blocktable/...`, `blocktable/kernels/...`). `kernel` is the
slot-mapping kernel the fuzzing runs for it; `env` adds environment variables (the
oracle-kernel mutants switch the data oracle to its Triton engine, and the KV-kernel
mutants the KV worlds to our Triton kernels, which the interpreter otherwise skips
for speed). `equivalent` says why a mutant cannot be
observed within the harness's reach; those are reported, not required.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mutant:
    id: str
    layer: str  # kernel | table | pool | sequence | prefix | kv kernels | oracle kernels
    path: str
    old: str
    new: str
    imitates: str
    kernel: str = "triton"
    env: dict[str, str] = field(default_factory=dict)
    equivalent: str | None = None


SLOTS = "blocktable/kernels/slot_mapping.py"
WRAPPERS = "blocktable/slot.py"
TABLE = "blocktable/table.py"
POOL = "blocktable/pool.py"
SEQUENCE = "blocktable/sequence.py"
PREFIX = "blocktable/prefix.py"
ORACLE = "blocktable/kernels/oracle.py"
KV_KERNELS = "blocktable/kernels/kv.py"
KV_WRAPPERS = "blocktable/kv.py"
TRITON_ORACLE = {"BLOCKTABLE_ORACLE": "triton"}
TRITON_KV = {"BLOCKTABLE_KV_KERNELS": "triton"}  # ours in the KV worlds, which the interpreter otherwise skips

CATALOGUE: tuple[Mutant, ...] = (
    # -- the slot-mapping kernels ---------------------------------------------------------
    Mutant("K01", "kernel", SLOTS, "tl.store(out_ptr + t, tl.where(keep, slot, -1), mask=t < max_num_tokens)",
           "tl.store(out_ptr + t, tl.where(keep, slot, -1), mask=t < max_num_tokens - 1)",
           "tail padding off by one: the last slot of [T, Tmax) is never written"),
    Mutant("K02", "kernel", SLOTS, "tl.store(out_ptr + t, tl.where(keep, slot, -1), mask=t < max_num_tokens)",
           "tl.store(out_ptr + t, tl.where(keep, slot, 0), mask=t < max_num_tokens)",
           "PAD written as 0: padded tokens overwrite slot 0 of the KV cache"),
    Mutant("K03", "kernel", SLOTS, "block = tl.load(row_ptr + col, mask=keep, other=0).to(tl.int64)",
           "block = tl.load(row_ptr + col, mask=keep, other=0)",
           "int32 product of block id and block size: ids near 2**31-1 wrap negative"),
    Mutant("K04", "kernel", SLOTS, "row_ptr = table_ptr + req.to(tl.int64) * table_stride",
           "row_ptr = table_ptr + req * table_stride",
           "row offset computed in int32", kernel="triton-per-request",
           equivalent="wraps only once rows * stride >= 2**31 (a table of 8 GiB or more), far beyond any table "
                      "the harness builds; the int64 cast is kept for production sizes"),
    Mutant("K05", "kernel", SLOTS, "keep = valid & local & (col < width)", "keep = valid & (col < width)",
           "missing where(is_local, ...): another rank's tokens get slots on this rank"),
    Mutant("K06", "kernel", SLOTS, "vb = K * W  # one virtual block", "vb = B * W  # one virtual block",
           "ownership decided in kernel-block coordinates (wrong when P > 1, W > 1 and I does not divide B)"),
    Mutant("K07", "kernel", SLOTS, "lofs = (vbo // (W * I)) * I + vbo % I", "lofs = vbo // W",
           "local offset that ignores the interleave I"),
    Mutant("K08", "kernel", SLOTS, "is_token = t < num_tokens", "is_token = t <= num_tokens",
           "token mask <=: token T (the first tail slot) is mapped from a stray position"),
    Mutant("K09", "kernel", SLOTS, "keep = valid & local & (col < width)", "keep = valid & local",
           "missing out-of-row guard: a column past the row reads the next row (vLLM's bug)"),
    Mutant("K10", "kernel", WRAPPERS, "kernel[(N + 1,)](", "kernel[(N,)](",
           "last request not launched (the tail program takes its place)", kernel="triton-per-request"),
    Mutant("K11", "kernel", SLOTS, "req = tl.where(start <= t, req + half, req)",
           "req = tl.where(start < t, req + half, req)",
           "request search with < instead of <=: a request's first token is given to the one before"),
    Mutant("K12", "kernel", WRAPPERS, "SEARCH_STEPS=max(0, N - 1).bit_length()", "SEARCH_STEPS=max(0, N - 2).bit_length()",
           "binary search one halving short: late requests' tokens land in earlier rows"),
    Mutant("K13", "kernel", SLOTS, "        end = tl.load(qsl_ptr + req + 1)", "        end = tl.load(qsl_ptr + req + 1) - 1",
           "request end off by one: each request's last token is never mapped", kernel="triton-per-request"),
    Mutant("K14", "kernel", SLOTS, "col = vbi * P + lofs // B", "col = vbi + lofs // B",
           "virtual block index not scaled by P: hybrid tables read the wrong column"),
    Mutant("K15", "kernel", SLOTS, "return block * B + lofs % B, keep", "return block * B + lofs % K, keep",
           "in-block offset taken modulo K instead of B"),
    Mutant("K16", "kernel", SLOTS, "tl.store(out_ptr + offs, tl.full([BLOCK], PAD, tl.int64), mask=offs < max_num_tokens)",
           "tl.store(out_ptr + offs, tl.full([BLOCK], PAD, tl.int64), mask=offs < max_num_tokens - 1)",
           "per-request kernel: tail padding off by one", kernel="triton-per-request"),
    Mutant("K17", "kernel", SLOTS, "block = tl.load(row_ptr + col, mask=keep, other=0).to(tl.int64)",
           "block = tl.load(row_ptr + col, mask=local & (col < width), other=0).to(tl.int64)",
           "lanes with no token read row 0 of the table (an empty batch's table may have no rows)"),
    Mutant("K18", "kernel", SLOTS, "if tl.load(qsl_ptr + r0 + 1) >= first + BLOCK:",
           "if tl.load(qsl_ptr + r0 + 1) >= first + BLOCK - 1:",
           "whole-tile test off by one: a tile whose last token starts the next request is mapped as one request's"),
    Mutant("K19", "kernel", SLOTS, "if first + BLOCK <= num_tokens:", "if first + BLOCK <= max_num_tokens:",
           "unmasked tiles decided by Tmax: tail tiles map stray positions instead of padding with -1"),
    # -- the block table ------------------------------------------------------------------
    Mutant("T01", "table", TABLE, "(blocks.astype(np.int64)[:, None] * P + np.arange(P))",
           "(blocks.astype(np.int64)[:, None] + np.arange(P) * P)",
           "map_to_kernel_blocks with the factors swapped"),
    Mutant("T02", "table", TABLE, "        self.host[dst, :n] = self.host[src, :n]\n        self.count[dst] = n",
           "        self.host[dst, :n] = self.host[src, :n]", "move_row that forgets the count"),
    Mutant("T03", "table", TABLE, "        self.host[src, :n] = 0\n        self.count[src] = 0\n", "",
           "move_row that leaves the source row in place"),
    Mutant("T04", "table", TABLE, "        if src == dst:\n            return\n        n = int(self.count[src])",
           "        n = int(self.count[src])", "move_row(a, a) wipes the row (copy, then clear the source)"),
    Mutant("T05", "table", TABLE, "        self.count[[a, b]] = self.count[[b, a]]\n", "",
           "swap_row that swaps the rows but not the counts"),
    Mutant("T06", "table", TABLE, "        self.host[r, :kernel.size] = kernel\n        self.count[r] = kernel.size",
           "        self.append_row(ids, r)", "add_row appending instead of replacing (a resumed request keeps stale blocks)"),
    Mutant("T07", "table", TABLE, "        if n == 0:\n            return\n        if self._staging is None:",
           "        n = max(0, n - 1)\n        if n == 0:\n            return\n        if self._staging is None:",
           "commit of n-1 rows: the last request's row never reaches the device"),
    Mutant("T08", "table", TABLE, "self.device_tensor[num_reqs:num_reqs_padded].fill_(NULL_BLOCK_ID)",
           "self.device_tensor[num_reqs:num_reqs_padded].fill_(-1)", "CUDA-graph padding with -1 instead of NULL_BLOCK_ID"),
    Mutant("T09", "table", TABLE, "        self.host[r, :self.count[r]] = 0\n        self.count[r] = 0",
           "        self.count[r] = 0", "clear_row that only resets the count"),
    Mutant("T10", "table", TABLE, "        if have + kernel.size > self.width:", "        if have + kernel.size >= self.width:",
           "overflow check off by one: a row filled exactly to its width is refused"),
    # -- the pool -------------------------------------------------------------------------
    Mutant("P01", "pool", POOL, "        if (counts > 1).any():", "        if False:",
           "a duplicate id in one free is queued twice (vLLM bug #42571)"),
    Mutant("P02", "pool", POOL, "        self.ref[blocks] -= 1\n        released = blocks[self.ref[blocks] == 0]",
           "        self.ref[blocks] = 0\n        released = blocks", "free that ignores ref counts (frees blocks still shared)"),
    Mutant("P03", "pool", POOL, "        first = 1 if null_block else 0\n        if not isinstance",
           "        first = 0\n        if not isinstance", "the null block is handed out"),
    Mutant("P04", "pool", SEQUENCE, "        for b in reversed(self.blocks[seq]):", "        for b in self.blocks[seq]:",
           "free order not reversed: the queue gets a request's blocks first block first"),
    Mutant("P05", "pool", POOL, "        zero = self.ref[blocks] == 0\n        if zero.any():\n            raise ValueError(f\"free: double",
           "        zero = self.ref[blocks] < 0\n        if zero.any():\n            raise ValueError(f\"free: double",
           "double free not detected"),
    Mutant("P06", "pool", POOL, "        self._head = (self._head + n) % len(self._ring)",
           "        self._head = (self._head + n - (n > 1)) % len(self._ring)",
           "ring-buffer head advanced one short: a block is handed out twice"),
    # -- sequences: fork and copy-on-write ---------------------------------------------------
    Mutant("S01", "sequence", SEQUENCE, "self.pool.share(sorted(set(blocks)))", "self.pool.share(list(blocks))",
           "fork counting a block listed twice in one table twice",
           equivalent="no legal operation sequence builds a table listing one block twice (fresh allocations only); "
                      "tests/reference/test_sequence.py pins the rule on a hand-built table"),
    Mutant("S02", "sequence", SEQUENCE, "            self._pending_copies.append(cow)\n", "",
           "copy-on-write that skips the copy (the new block holds stale KV)"),
    Mutant("S03", "sequence", SEQUENCE, "            self.pool.unshare(src)\n            blocks[-1] = dst",
           "            self.pool.unshare(src)", "copy-on-write that keeps writing the sibling's block"),
    Mutant("S04", "sequence", SEQUENCE, "        return bool(blocks) and self.num_tokens[seq] % self.tokens_per_block != 0 \\\n            and self.pool.ref[blocks[-1]] > 1",
           "        return bool(blocks) and self.pool.ref[blocks[-1]] > 1",
           "copy-on-write of a full shared block (a needless copy and allocation)"),
    Mutant("S05", "sequence", SEQUENCE, "        self._live(seq, \"preempt\")\n        self._give_back(seq)",
           "        self._live(seq, \"preempt\")\n        self.blocks.pop(seq)", "preempt that drops the blocks without freeing them (a leak)"),
    # -- prefix caching (docs/contract.md §8) -------------------------------------------------
    Mutant("X01", "prefix", POOL, "            if hash_of[b] is not None:\n                self._evict(b)\n", "",
           "eviction that leaves the block under its key: a later hit reads another request's KV (vLLM #4764)"),
    Mutant("X02", "prefix", PREFIX, "return hashlib.blake2b(parent + salt + block, digest_size=16).digest()",
           "return hashlib.blake2b(salt + block, digest_size=16).digest()",
           "a block's key that ignores the prefix before it: equal blocks after different prefixes collide"),
    Mutant("X03", "prefix", PREFIX, "return hashlib.blake2b(parent + salt + block, digest_size=16).digest()",
           "return hashlib.blake2b(parent + block, digest_size=16).digest()",
           "a key that ignores the KV-cache group: one group hits another group's blocks (hybrid models)"),
    Mutant("X04", "prefix", POOL, "        for b in blocks[self.ref[blocks] == 0].tolist():\n            self._unlink(b)\n", "",
           "touch that leaves a revived (ref 0) block in the free queue: it is handed out while in use"),
    Mutant("X05", "prefix", POOL,
           "            last = prv[tail]\n            nxt[last], prv[b], nxt[b], prv[tail] = b, last, tail, b",
           "            first = nxt[self._HEAD]\n            nxt[self._HEAD], prv[b], nxt[b], prv[first] = b, self._HEAD, first, b",
           "free that queues blocks at the head: the freshest cached prefixes are evicted first"),
    Mutant("X06", "prefix", PREFIX, "    L = tokens.size - 1\n", "    L = tokens.size\n",
           "a hit that takes the last token too: no token left to compute (the len - 1 rule)"),
    Mutant("X07", "prefix", PREFIX, "    return L // step * step\n", "    return L\n",
           "hit length not a multiple of every group's block tokens (hybrid hit lengths, vLLM #33270)"),
    Mutant("X08", "prefix", POOL, "        if self._size != self.num_usable:\n            return False\n", "",
           "reset_prefix_cache while blocks are in use: their keys vanish under running requests"),
    Mutant("X09", "prefix", POOL, "        del blocks[b]\n        if not blocks:\n            del self._cached[h]\n",
           "        for other in self._cached.pop(h)[2]:\n            self._hash_of[other] = None\n",
           "eviction that drops every block of the key, not only the one handed out (kvcached #362)"),
    Mutant("X10", "prefix", POOL, "            self._push(released.tolist())\n            return\n",
           "            self._push(released.tolist())\n            for b in released.tolist():\n"
           "                if self._hash_of[b] is not None:\n                    self._evict(b)\n            return\n",
           "free that drops the keys: a finished request's prefix is never hit again"),
    # -- the KV path's kernels (docs/contract.md §9), in the lockstep's KV worlds -----------
    Mutant("V01", "kv kernels", KV_WRAPPERS, "        n, num_slots, sizes.block_size, H,",
           "        key.shape[0], num_slots, sizes.block_size, H,",
           "token count taken from the padded key, not the slot mapping (vLLM #13418)", env=TRITON_KV),
    Mutant("V02", "kv kernels", KV_KERNELS, "keep = (slot >= 0) & (slot < num_slots)  # < 0",
           "keep = slot < num_slots  # < 0", "slot -1 written, into the entry before block 0 (vLLM #43810)", env=TRITON_KV),
    Mutant("V03", "kv kernels", KV_WRAPPERS, "else (s[0], s[2], s[1], s[3])", "else (s[0], s[1], s[2], s[3])",
           "HND caches addressed as NHD: layouts confused", env=TRITON_KV),
    Mutant("V04", "kv kernels", KV_KERNELS,
           "normal = (a + (0x7FFFF - (120 << 23)) + ((a >> 20) & 1)) >> 20", "normal = (a - (120 << 23)) >> 20",
           "fp8 rounded toward zero, not to nearest even", env=TRITON_KV),
    Mutant("V05", "kv kernels", KV_KERNELS, "a = tl.minimum(q, 448.0).to(tl.int32, bitcast=True)",
           "a = q.to(tl.int32, bitcast=True)", "fp8 not saturated: values past 448 overflow into NaN and the sign", env=TRITON_KV),
    Mutant("V06", "kv kernels", KV_KERNELS, "    return tl.where((bits & 0x7FFFFFFF) > FLOAT32_INF, 0x7F, code)\n",
           "    return code\n", "fp8 NaN not kept: a NaN is stored as 448", env=TRITON_KV),
    Mutant("V07", "kv kernels", KV_WRAPPERS, "    rows = size_1 * size_2\n", "    rows = size_1 * size_2 - 1\n",
           "a partial block copied: the last row of each block is left behind", env=TRITON_KV),
    Mutant("V08", "kv kernels", KV_KERNELS, "src = tl.load(pairs_ptr + pair * pairs_stride_0)",
           "src = tl.load(pairs_ptr + pair * pairs_stride_0 + pairs_stride_1)",
           "copy that reads its destination: copy-on-write copies nothing", env=TRITON_KV),
    Mutant("V09", "kv kernels", KV_KERNELS, "valid = (t < total) & (t < out_rows)", "valid = t < out_rows",
           "gather past the length: output rows past cu_lens[N] are overwritten", env=TRITON_KV),
    Mutant("V10", "kv kernels", KV_WRAPPERS, "    s = cache.stride()\n", "    s = torch.empty(cache.shape).stride()\n",
           "strides of a non-contiguous cache ignored (FlashInfer #527): views of one tensor, padded heads", env=TRITON_KV),
    Mutant("V11", "kv kernels", KV_KERNELS, "    value = (magnitude.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True) * scale\n",
           "    value = (magnitude.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)\n",
           "fp8 gather that does not multiply by the scale", env=TRITON_KV),
    Mutant("V12", "kv kernels", KV_KERNELS,
           "row = r.to(tl.int64) * table_stride_0 + column.to(tl.int64) * table_stride_1",
           "row = column.to(tl.int64) * table_stride_1", "gather through the first row of the table for every request", env=TRITON_KV),
    Mutant("V13", "kv kernels", KV_KERNELS, "    write_one(value_ptr, value_stride_token,",
           "    write_one(key_ptr, value_stride_token,", "the key written into the value cache too", env=TRITON_KV),
    Mutant("V14", "kv kernels", KV_KERNELS, "block = tl.load(table_ptr + row, mask=in_row, other=0).to(tl.int64)",
           "block = tl.load(table_ptr + row, mask=in_row, other=0)",
           "32-bit product of a block id and the block stride in gather (FlashInfer #3136)",
           equivalent="wraps only once a block id times the block stride reaches 2**31 elements (a cache of 2 GiB "
                      "or more at one byte an element); the lockstep's caches are far smaller, and the product is "
                      "int64 for production sizes", env=TRITON_KV),
    # -- the data oracle's kernels ---------------------------------------------------------
    Mutant("O01", "oracle kernels", ORACLE, "in_cache = (index >= 0) & (index < num_slots)",
           "in_cache = index < num_slots", "KV write that does not skip padded slots (writes through slot -1)",
           env=TRITON_ORACLE),
    Mutant("O02", "oracle kernels", ORACLE, "        in_block = offs < block_slots\n", "        in_block = offs < block_slots - 1\n",
           "block copy one slot short", env=TRITON_ORACLE),
    Mutant("O03", "oracle kernels", ORACLE, "readable = in_range & (owner == rank) & (column < width)",
           "readable = in_range & (column < width)", "read-back that ignores which rank owns a token", env=TRITON_ORACLE),
    Mutant("O04", "oracle kernels", ORACLE, "value = tl.load(cache_ptr + rank.to(tl.int64) * num_slots + index",
           "value = tl.load(cache_ptr + index", "read-back from rank 0's cache on every rank", env=TRITON_ORACLE),
)


def by_id() -> dict[str, Mutant]:
    return {m.id: m for m in CATALOGUE}
