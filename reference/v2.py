"""docs/contract.md §10: vLLM's model-runner-V2 block tables, one entry and one token at a time.

A request keeps its slot `r` for life, and its rows are never moved, cleared or swapped.
The host side only stages kernel ids and moves the host count (§10.3);
`apply_staged_writes` lands the staged ids in `rows` and snapshots the counts the kernels
see (§10.4). Each step then gathers rows into batch order (`inp`, §10.5) and maps every
token to a slot (`slots`, §10.7). Both step outputs are views of persistent buffers,
because a captured CUDA graph reads those buffers, not fresh copies (§10.6, §10.9).

Every check of a call runs before the call changes anything (the checks are in
`reference/v2_checks.py`). Slot arithmetic is in Python integers, which never wrap.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocktable.reference.layout import (
    INT32_MAX,
    NULL_BLOCK_ID,
    PAD_SLOT_ID,
    map_to_kernel_blocks,
)
from blocktable.reference.v2_checks import (
    block_id_lists,
    config_flags,
    config_int,
    config_ints,
    count,
    int_array,
    is_bool,
    is_int,
    slot_entries,
)

# (group, slot, first column, kernel ids): one write that apply_staged_writes will land.
Staged = tuple[int, int, int, list[int]]


class BlockTables:
    """§10.1 state, built by §10.2's rules. All state is public so the harness can compare it whole."""

    def __init__(self, block_sizes: list[int], max_num_reqs: int, max_num_batched_tokens: int,
                 max_num_blocks_per_group: list[int], kernel_block_sizes: list[int] | None = None,
                 cp_size: int = 1, cp_rank: int = 0, cp_interleave: int = 1,
                 dcp_sharded: list[bool] | None = None, slot_mapping_enabled: list[bool] | None = None) -> None:
        """§10.2. Defaults: B_g = K_g, every group sharded, every group enabled."""
        # Every kind check first (TypeError), then the value checks §10.2 lists (ValueError).
        K = config_ints("block_sizes", block_sizes)
        M = config_ints("max_num_blocks_per_group", max_num_blocks_per_group)
        B = list(K) if kernel_block_sizes is None else config_ints("kernel_block_sizes", kernel_block_sizes)
        sharded = config_flags("dcp_sharded", dcp_sharded, len(K))
        enabled = config_flags("slot_mapping_enabled", slot_mapping_enabled, len(K))
        Rmax = config_int("max_num_reqs", max_num_reqs)
        Tmax = config_int("max_num_batched_tokens", max_num_batched_tokens)
        W = config_int("cp_size", cp_size)
        R = config_int("cp_rank", cp_rank)
        I = config_int("cp_interleave", cp_interleave)

        lengths = {"block_sizes": len(K), "max_num_blocks_per_group": len(M), "kernel_block_sizes": len(B),
                   "dcp_sharded": len(sharded), "slot_mapping_enabled": len(enabled)}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"the per-group lists differ in length: {lengths}")
        for name, values in (("block_sizes", K), ("kernel_block_sizes", B), ("max_num_blocks_per_group", M),
                             ("max_num_reqs", [Rmax]), ("max_num_batched_tokens", [Tmax])):
            for v in values:
                if v < 1:
                    raise ValueError(f"{name} must be >= 1, got {v}")
        for g in range(len(K)):
            if K[g] % B[g] != 0:
                raise ValueError(f"group {g}: block size {K[g]} is not a multiple of kernel block size {B[g]}")
        if W < 1:
            raise ValueError(f"cp_size must be >= 1, got {W}")
        if not 0 <= R < W:
            raise ValueError(f"cp_rank {R} is out of range [0, {W})")
        if I < 1:
            raise ValueError(f"cp_interleave must be >= 1, got {I}")
        # The interleave only shapes a sharded group's layout when DCP is on; a
        # replicated group (every token on every rank) never reads it.
        for g in range(len(K)):
            if W > 1 and sharded[g] and not (I <= K[g] and K[g] % I == 0):
                raise ValueError(f"group {g} is sharded: cp_interleave {I} must divide its block size {K[g]}")

        self.num_groups = len(K)
        self.block_sizes = K
        self.kernel_block_sizes = B
        self.max_num_blocks_per_group = M
        self.kernel_blocks_per_block = [k // b for k, b in zip(K, B)]  # P_g
        self.widths = [m * p for m, p in zip(M, self.kernel_blocks_per_block)]
        self.sharded = sharded
        self.enabled = enabled
        self.max_num_reqs = Rmax
        self.max_num_batched_tokens = Tmax
        self.cp_size, self.cp_rank, self.cp_interleave = W, R, I

        G = self.num_groups
        self.rows = [np.zeros((Rmax, w), dtype=np.int32) for w in self.widths]
        self.cnt = np.zeros((G, Rmax), dtype=np.int32)
        self.cnt_dev = np.zeros((G, Rmax), dtype=np.int32)
        self.staged: list[Staged] = []
        self.inp = [np.zeros((Rmax, w), dtype=np.int32) for w in self.widths]
        self.slots = np.zeros((G, Tmax), dtype=np.int64)

    # -- §10.3 ---------------------------------------------------------------------------

    def append_block_ids(self, r: int, new_block_ids: Any, overwrite: bool) -> None:
        """§10.3: stage each group's expanded ids at start_g (0 or the host count) and set the
        host count to end_g. Neither `rows` nor `cnt_dev` changes until the next apply."""
        if not is_int(r) or not 0 <= r < self.max_num_reqs:
            raise ValueError(f"r must be a slot in [0, {self.max_num_reqs}), got {type(r).__name__} {r!r}")
        r = int(r)
        if not is_bool(overwrite):
            # Truthiness of an arbitrary object would turn a wrong argument into a silent reset.
            raise ValueError(f"overwrite must be a bool, got {type(overwrite).__name__} {overwrite!r}")
        per_group = block_id_lists(new_block_ids, self.num_groups)

        planned = []
        for g, ids in enumerate(per_group):
            P = self.kernel_blocks_per_block[g]
            for b in ids:
                # The last kernel id of b must still be an int32 table entry.
                if b < 0 or b * P + P - 1 > INT32_MAX:
                    raise ValueError(f"group {g}: block id {b} does not fit: kernel ids "
                                     f"{b}*{P}..{b}*{P}+{P - 1} must lie in [0, 2**31-1]")
            kernel_ids = map_to_kernel_blocks(ids, P)
            start = 0 if overwrite else int(self.cnt[g, r])
            end = start + len(kernel_ids)
            if end > self.widths[g]:
                raise ValueError(f"group {g}, slot {r}: {len(kernel_ids)} kernel ids from column {start} "
                                 f"end at {end}, past width {self.widths[g]}")
            planned.append((g, start, kernel_ids, end))

        for g, start, kernel_ids, end in planned:
            if kernel_ids:
                self.staged.append((g, r, start, kernel_ids))
            # Also when nothing is staged: an overwrite with no ids resets the count to 0
            # and leaves the entries as they are (stale).
            self.cnt[g, r] = end

    # -- §10.4 ---------------------------------------------------------------------------

    def apply_staged_writes(self) -> None:
        """§10.4: land the staged writes in staging order, then empty `staged` and snapshot
        cnt_dev = cnt. Whether it is one launch or one per group makes no difference here."""
        for g, r, start, kernel_ids in self.staged:
            # A reading: where two writes overlap the later one wins (vLLM runs them as
            # concurrent programs, so there they race; its runner never stages that).
            # numpy indexes with int64 offsets, so no row offset wraps (#57030).
            self.rows[g][r, start:start + len(kernel_ids)] = kernel_ids
        self.staged.clear()
        self.cnt_dev[:, :] = self.cnt

    # -- §10.5, §10.6 --------------------------------------------------------------------

    def _idx_mapping(self, idx_mapping: Any) -> np.ndarray:
        return int_array("idx_mapping", idx_mapping, (np.int32, np.int64))

    def gather_block_tables(self, idx_mapping: np.ndarray, num_reqs_padded: int) -> tuple[np.ndarray, ...]:
        """§10.5: inp[g][b] takes the first cnt_dev[g, idx[b]] entries of rows[g][idx[b]] and keeps
        the rest (stale); dummies and padding rows become zero; rows past num_reqs_padded are untouched."""
        idx = self._idx_mapping(idx_mapping)
        padded = count("num_reqs_padded", num_reqs_padded)
        N = len(idx)
        if N > padded:
            raise ValueError(f"idx_mapping holds {N} requests, more than num_reqs_padded {padded}")
        if padded > self.max_num_reqs:
            raise ValueError(f"num_reqs_padded {padded} exceeds max_num_reqs {self.max_num_reqs}")
        slots_of_batch = slot_entries(idx, self.max_num_reqs)

        for g in range(self.num_groups):
            for b in range(padded):
                r = slots_of_batch[b] if b < N else None
                if r is not None and r >= 0:
                    n = int(self.cnt_dev[g, r])
                    self.inp[g][b, :n] = self.rows[g][r, :n]
                elif r == -1:
                    # A reading: a dummy owns no blocks (vLLM reads out of bounds here).
                    self.inp[g][b, :] = NULL_BLOCK_ID
                else:
                    # CUDA-graph padding, over this group's own width (#38831).
                    self.inp[g][b, :] = NULL_BLOCK_ID
        return tuple(self.inp[g][:padded] for g in range(self.num_groups))

    def get_dummy_block_tables(self, n: int) -> tuple[np.ndarray, ...]:
        """§10.6: rows [:n] of every inp[g] become zero, in place (#49757: not the previous
        step's rows); the result is the persistent storage itself."""
        n = count("n", n)
        if not 0 <= n <= self.max_num_reqs:
            raise ValueError(f"n {n} is out of range [0, {self.max_num_reqs}]")
        for g in range(self.num_groups):
            self.inp[g][:n, :] = NULL_BLOCK_ID
        return tuple(self.inp[g][:n] for g in range(self.num_groups))

    # -- §10.7, §10.8 --------------------------------------------------------------------

    def compute_slot_mappings(self, idx_mapping: np.ndarray, query_start_loc: np.ndarray, positions: np.ndarray,
                              num_tokens_padded: int) -> np.ndarray:
        """§10.7: slots[g, t] for every scheduled token of every enabled group, read from `rows`
        by slot (not from `inp`, and without `cnt`); -1 past T up to Tmax."""
        idx = self._idx_mapping(idx_mapping)
        qsl = int_array("query_start_loc", query_start_loc, (np.int32,))
        pos = int_array("positions", positions, (np.int64,))
        padded = count("num_tokens_padded", num_tokens_padded)
        N = len(idx)
        # A reading: §10.5's rules with num_reqs_padded = N, so at most Rmax requests.
        if N > self.max_num_reqs:
            raise ValueError(f"idx_mapping holds {N} requests, more than max_num_reqs {self.max_num_reqs}")
        slots_of_batch = slot_entries(idx, self.max_num_reqs)
        if len(qsl) < N + 1:
            raise ValueError(f"query_start_loc must hold at least N+1 = {N + 1} entries, got {len(qsl)}")
        # Only qsl[0..N] and positions[:T] are read, so only they are checked.
        starts = [int(x) for x in qsl[:N + 1]]
        if starts[0] != 0:
            raise ValueError(f"query_start_loc[0] must be 0, got {starts[0]}")
        for b in range(N):
            if starts[b + 1] < starts[b]:
                raise ValueError(f"query_start_loc decreases at request {b}: {starts[b]} -> {starts[b + 1]}")
        T = starts[N]
        if T > padded:
            raise ValueError(f"{T} scheduled tokens exceed num_tokens_padded {padded}")
        if padded > self.max_num_batched_tokens:
            raise ValueError(f"num_tokens_padded {padded} exceeds max_num_batched_tokens {self.max_num_batched_tokens}")
        if len(pos) < T:
            raise ValueError(f"positions holds {len(pos)} entries, fewer than the {T} scheduled tokens")
        for t in range(T):
            if pos[t] < 0:
                raise ValueError(f"position {pos[t]} of token {t} is negative")

        for g in range(self.num_groups):
            # The pad starts at the real token count, not the padded one (#36580).
            self.slots[g, T:] = PAD_SLOT_ID
            if not self.enabled[g]:
                # Its metadata builder maps slots itself (ring buffers, tails).
                self.slots[g, :T] = PAD_SLOT_ID
                continue
            for b in range(N):
                for t in range(starts[b], starts[b + 1]):
                    self.slots[g, t] = self._slot_of(g, slots_of_batch[b], int(pos[t]))
        return self.slots[:, :padded]

    def _slot_of(self, g: int, r: int, p: int) -> int:
        """§10.7's per-token rule for group g, slot r (-1: a dummy), position p; Python ints throughout."""
        if r == -1:
            return PAD_SLOT_ID  # a dummy has no row to read (#56734)
        K, B, width = self.block_sizes[g], self.kernel_block_sizes[g], self.widths[g]
        W, R, I = self.cp_size, self.cp_rank, self.cp_interleave
        if self.sharded[g] and W > 1:
            # Ownership in allocation-block coordinates (#51031): a virtual block is
            # K tokens on each of W ranks, dealt out I at a time.
            VB = K * W
            vbi = p // VB
            vbo = p - vbi * VB
            if (vbo // I) % W != R:
                return PAD_SLOT_ID
            # l counts this rank's own tokens: K of them per virtual block.
            l = vbi * K + (vbo // (W * I)) * I + vbo % I
        else:
            l = p  # replicated, or no DCP: every token is this rank's
        col = l // B
        if col >= width:
            return PAD_SLOT_ID  # the guard: vLLM's load reads the next row (#53982, #54296)
        # int() before the product: vLLM multiplies in int32 and wraps.
        return int(self.rows[g][r, col]) * B + l % B

    def get_dummy_slot_mappings(self, n: int) -> np.ndarray:
        """§10.8: the whole buffer, every group and all Tmax columns, becomes -1; return its first n columns."""
        n = count("n", n)
        if not 0 <= n <= self.max_num_batched_tokens:
            raise ValueError(f"n {n} is out of range [0, {self.max_num_batched_tokens}]")
        self.slots[:, :] = PAD_SLOT_ID
        return self.slots[:, :n]
