"""The KV path in the lockstep (docs/contract.md §9): a world with `kv` set keeps real
KV caches, one pair per group, and drives them with the KV kernels under test (ours by
default, or the plug-ins named by `--kv-write`, `--kv-copy`, `--kv-gather`).

Each step, for each group: the copy-on-write pairs are copied (every kernel block of
each allocation block), with up to two scratch copies onto free blocks, every
scheduled token's key and value rows are written through the slot mappings the
slot-mapping kernel returned, and the sequences the step computed are gathered back
through the implementation's device table. The numpy reference does the same through
the reference's slot mappings, pairs and table (kv/truth.py: reference/kv.py's
reading, vectorized, so that long rows and large batches cost little). After the step
the whole of each group's cache memory (guard cells before and after, padding between
heads, and every block the step did not touch included) is compared bit for bit with
the reference's, on the device, against a copy of the reference's memory kept there
(kv/mirror.py); the memory comes back whole only to report a difference. Then the
gathered rows are compared, padding rows past the last length included.

A group's DCP ranks share one cache pair: rank R's blocks follow rank R-1's, its
slots and table ids shifted by R * (blocks per rank). That is one write, one copy
and one gather per group per step, however many ranks, which keeps the interpreter
affordable. Keys and values are a function of each token's value (a hash), so a
recomputed token writes what it wrote before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from blocktable.checks import data_checks
from blocktable.device import to_host, upload, upload_arrays
from blocktable.plugin import KV_CONTRACTS, KVKernels
from blocktable.properties.compare import Discrepancy, Handed, raised
from blocktable.properties.kv import truth as ref_kv  # the reference's §9, vectorized (tests prove them equal)
from blocktable.properties.kv.cache import (
    GUARD,
    CachePair,
    cache_dtype,
    cache_pair,
    flat_size,
    kernel_options,
    locate,
    out_dtype,
)
from blocktable.properties.kv.compare import NAN_NOTE, differing
from blocktable.properties.kv.data import HOST, fetchable, filled, for_upload, received, to_device, token_data
from blocktable.properties.kv.mirror import Mirror, block_cells, entry_cells
from blocktable.properties.lockstep import events
from blocktable.properties.lockstep.state import State
from blocktable.properties.world import KVConfig
from blocktable.reference.kv import bits

PAD_ROWS = 3  # rows past the last gathered one, which a gather must leave alone
KEY_PAD_ROWS = 3  # a step's key rows past its slot mapping: 1 to this many
OUT_FILL = 0x5A  # every byte of a gather's outputs before the call, on both sides


def scratch_pairs(pool: Any, cow: list[tuple[int, int]], k: int) -> list[tuple[int, int]]:
    """Step k's up to two more copies besides the copy-on-write pairs `cow`, onto free
    blocks of the reference's `pool` (ref 0, not the null block, holding no cached
    prefix): copy-on-write is rare in generated programs, and the copy kernel should
    run on most steps. The reference copies them too; nothing reads a free block
    before it is written again. Blocks are taken by id, from masks over the pool: block
    by block, asking the cache map for each, this was a KV step's costliest Python."""
    ref = np.asarray(pool.ref)
    free_mask = ref == 0
    off = [b for pair in cow for b in pair] + [b for blocks in pool.cached.values() for b in blocks]
    free_mask[np.array(off + ([0] if pool.null_block else []), dtype=np.int64)] = False
    free = np.flatnonzero(free_mask).tolist()
    if not free:
        return []
    # No block may be both a source and a destination in one call: a
    # copy-on-write destination is not a source here.
    used_mask = ref > 0
    used_mask[np.array([d for _, d in cow], dtype=np.int64)] = False
    used = np.flatnonzero(used_mask).tolist()
    dsts = list(dict.fromkeys(free[(k * 7 + i) % len(free)] for i in range(min(2, len(free)))))
    sources = used or [b for b in free if b not in dsts]
    return [(sources[(k * 3 + i) % len(sources)], d) for i, d in enumerate(dsts)] if sources else []


def repeat_for_ranks(rows: np.ndarray, T: int, W: int) -> np.ndarray:
    """The step's T token rows once per rank (the ranks' stacked caches), then the padding rows."""
    return np.concatenate([rows[:T]] * W + [rows[T:]])


@dataclass
class GroupStep:
    """What one group's step sends to the device, made on the host: its copy pairs in
    stacked kernel blocks ([n, 2], None without any), its mirror's changes ([2, n],
    None without any; kv/mirror.py) and its gather's cumulative lengths."""

    mapping: np.ndarray | None
    mirror: np.ndarray | None
    cu: np.ndarray

    def arrays(self) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
        """What the step uploads for this group, in the order it is used."""
        return self.mapping, self.mirror, self.cu


class KVWorld:
    """Every group's caches on both sides, and the step's launches and comparisons."""

    def __init__(self, state: State, kv: KVConfig, kernels: KVKernels) -> None:
        self.state, self.kv, self.kernels = state, kv, kernels
        run = state
        self.cache_dtype, self.out_dtype = cache_dtype(kv), out_dtype(kv)
        rng = np.random.default_rng(7)
        self.ref: list[CachePair] = []
        self.impl: list[CachePair] = []
        self.elements: list[np.ndarray | None] = []
        self.mirrors: list[Mirror] = []  # each group's expected cache memory, on the device (kv/mirror.py)
        self.blocks_per_rank: list[int] = []
        # Each group's first slot of every rank ([W, 1]), the slots its key padding rows
        # name (the cache's last ones), and -1: made once, as every torch operation of
        # a step is a launch on a GPU.
        self.rank_starts: list[torch.Tensor] = []
        self.tails: list[torch.Tensor] = []
        self.table_shifts: list[tuple[np.ndarray, torch.Tensor]] = []  # what each rank's table ids gain, [W * rows, 1]
        self.minus_one = torch.full((), -1, dtype=torch.int64, device=run.backend.device)
        for lay in run.layouts:
            per_rank = run.world.num_blocks * lay.kernel_blocks_per_block
            blocks, B = per_rank * lay.world, lay.kernel_block_size
            rank_slots = per_rank * B
            count = torch.arange(max(lay.world, KEY_PAD_ROWS), dtype=torch.int64, device=run.backend.device)
            self.rank_starts.append(count[:lay.world, None] * rank_slots)
            self.tails.append(lay.world * rank_slots - 1 - count[:KEY_PAD_ROWS])
            shifts = np.repeat(np.arange(lay.world, dtype=np.int32) * per_rank, run.world.max_num_reqs)[:, None]
            self.table_shifts.append((shifts, upload(torch.from_numpy(shifts), run.backend)))
            host = rng.integers(0, 256, flat_size(kv, blocks, B) * np.dtype(HOST[self.cache_dtype]).itemsize,
                                dtype=np.uint8).view(HOST[self.cache_dtype])  # random bits: every cell is checked
            self.blocks_per_rank.append(per_rank)
            self.ref.append(cache_pair(host, kv, blocks, B))
            self.impl.append(cache_pair(to_device(host, self.cache_dtype, run.backend), kv, blocks, B))
            # An fp8 cache's cells that hold a cache element (not a guard, not padding):
            # where its two NaN codes count as equal (docs/contract.md §9).
            elements = None
            if self.cache_dtype == "uint8":
                cells = cache_pair(np.zeros(len(host), dtype=bool), kv, blocks, B)
                cells.key[...] = True
                cells.value[...] = True
                elements = cells.flat
            self.elements.append(elements)
            self.mirrors.append(Mirror(host, run.backend, elements))
        self.errors: list[Discrepancy] = []
        self.expected_out: list[tuple[np.ndarray, np.ndarray]] = []
        self.step_slots: list[np.ndarray] = []
        self.values = np.zeros(0, np.int64)
        self.gathered: list[list[tuple[int, int, int]]] = []  # per group: (request, rank, local length) by row
        self.tokens: list[tuple[int | None, int]] = []  # the step's tokens: (request, position)
        self.step_pairs: list[list[tuple[int, int]]] = []  # per group: the step's copies, in stacked kernel blocks
        self.gather_rows: list[int] = []  # per group: the gathered rows whose NaNs may differ in encoding

    def options(self) -> dict[str, Any]:
        return kernel_options(self.kv)

    def _call(self, what: str, g: int, fn: Any, *args: Any, **kwargs: Any) -> None:
        handed = Handed.of(KV_CONTRACTS[what.removeprefix("kv-")], args)
        try:
            fn(*args, **kwargs)
        except Exception as e:  # a kernel that refuses valid input is wrong too; said after the slot checks
            error = raised(what, e, group=g)
            error.message = f"the {what} kernel raised {type(e).__name__}: {e}"
            self.errors.append(error)
            return
        changed = handed.changed()  # said first, with the kernel's other errors: the read-back cannot be trusted
        if changed is not None:
            self.errors.append(Discrepancy(what, changed, group=g))

    def launch(self, calls: list[Any], pairs: list[list[tuple[int, int]]], qsl: np.ndarray,
               positions: np.ndarray, values: np.ndarray, written: dict[int, int],
               expected_slots: list[np.ndarray]) -> list[torch.Tensor]:
        """Every group's copy, write and gather: the reference's on the host first,
        through the reference's slot mappings (`expected_slots`: each group's [W, Tmax]),
        then all the device needs in one upload (each upload from pageable memory is a
        staging copy, a transfer and an event), then the kernels. Returns what to bring
        back with the step."""
        run, kv = self.state, self.kv
        T = len(positions)
        self.values = values
        pad = 1 + int(T % KEY_PAD_ROWS)  # key rows past the slot mapping: never read
        keyed = np.concatenate([self.values, -1 - np.arange(pad)])
        host_k, host_v = token_data(keyed, kv, 0), token_data(keyed, kv, 1)
        self.errors, self.expected_out, self.step_slots, self.gathered, self.step_pairs = [], [], [], [], []
        self.gather_rows = []
        self.tokens = [(run.rows[r], int(positions[t])) for r in range(len(qsl) - 1)
                       for t in range(int(qsl[r]), int(qsl[r + 1]))]
        # The keys and values once per DCP world size (rank R writes rank 0's rows into
        # its own part of the stacked caches), then each group's copy pairs, mirror
        # changes and gather lengths.
        widths = sorted({lay.world for lay in run.layouts})
        rows = {W: [repeat_for_ranks(h, T, W) for h in (host_k, host_v)] for W in widths}
        plans = [self._reference_step(g, pairs[g], rows[lay.world], T, written, expected_slots[g])
                 for g, lay in enumerate(run.layouts)]
        arrays = [for_upload(h, kv.dtype) for W in widths for h in rows[W]]
        arrays += [a for plan in plans for a in plan.arrays() if a is not None]
        uploads = iter(upload_arrays(arrays, run.backend))
        data = {W: [received(next(uploads), kv.dtype) for _ in range(2)] for W in widths}
        on_device = [[None if a is None else next(uploads) for a in plan.arrays()] for plan in plans]
        back: list[torch.Tensor] = []
        first = run.steps_checked == 0
        for g, (lay, (mapping, changes, cu)) in enumerate(zip(run.layouts, on_device)):
            impl = self.impl[g]
            with data_checks(first):
                if mapping is not None:
                    self._call("kv-copy", g, self.kernels.copy, [impl.key], [impl.value], mapping)
                # Rank R's slots follow rank R-1's; a slot outside the rank's cache (a
                # wrong slot mapping, reported by the slot comparison) is passed as -1.
                # The slots sit in a longer buffer whose tail names real slots (the
                # cache's last ones), one per key padding row: a kernel that takes its
                # token count from the key (vLLM #13418) writes the padding rows there.
                out = calls[g].outputs[:, :T]
                stacked = out if lay.world == 1 else out + self.rank_starts[g]
                inside = (out >= 0) & (out < self.blocks_per_rank[g] * lay.kernel_block_size)
                slots = torch.cat([torch.where(inside, stacked, self.minus_one).reshape(-1),
                                   self.tails[g][:pad]])[:lay.world * T]
                keys, vals = data[lay.world]
                self._call("kv-write", g, self.kernels.write, keys, vals, impl.key, impl.value, slots, **self.options())
                if changes is not None:
                    self.mirrors[g].apply(changes)
                back.append(self.mirrors[g].count_differing(impl.flat, run.kernels.strict_nan))
                assert cu is not None  # every group gathers
                back += self._gather(g, cu)
        return back

    def _reference_step(self, g: int, cow: list[tuple[int, int]], rows: list[np.ndarray], T: int,
                        written: dict[int, int], expected: np.ndarray) -> GroupStep:
        """Group g's copy, write and gather on the reference's side, and what the device
        needs for the implementation's (`rows`: the step's keys and values, once per rank)."""
        run, kv, lay = self.state, self.kv, self.state.layouts[g]
        per_rank, P, W = self.blocks_per_rank[g], lay.kernel_blocks_per_block, lay.world
        ref = self.ref[g]
        changed: list[np.ndarray] = []  # the flat cells of the reference's memory this step writes
        step_pairs = cow + scratch_pairs(run.reference.pool, cow, run.steps_checked)
        kernel_pairs = [(R * per_rank + s * P + j, R * per_rank + d * P + j)
                        for R in range(W) for s, d in step_pairs for j in range(P)]
        self.step_pairs.append(kernel_pairs)
        mapping = None
        if kernel_pairs:
            mapping = np.array(kernel_pairs, dtype=np.int64).reshape(-1, 2)
            ref_kv.copy_blocks([ref.key], [ref.value], mapping)
            changed += [block_cells(view, ref.flat, mapping[:, 1]) for view in (ref.key, ref.value)]
            if cow:
                run.event(events.KV_COPY)
        rank_slots = per_rank * lay.kernel_block_size
        ref_slots = np.where(expected[:, :T] >= 0, expected[:, :T] + np.arange(W)[:, None] * rank_slots, -1).reshape(-1)
        self.step_slots.append(ref_slots)
        if T and kv.kv_cache_dtype == "fp8_e4m3":
            run.event(events.KV_FP8)
        ref_kv.write(rows[0], rows[1], ref.key, ref.value, ref_slots, **self.options())
        block, offset = np.divmod(ref_slots[ref_slots >= 0], lay.kernel_block_size)
        changed += [entry_cells(view, ref.flat, kv.layout, block, offset) for view in (ref.key, ref.value)]
        return GroupStep(mapping, self.mirrors[g].changes(np.concatenate(changed)), self._reference_gather(g, written))

    def _reference_gather(self, g: int, written: dict[int, int]) -> np.ndarray:
        """The reference's gather of the sequences this step computed, on every rank of
        group g (kept for the comparison); returns the gather's cumulative lengths."""
        run, kv, lay = self.state, self.kv, self.state.layouts[g]
        W, rows = lay.world, run.world.max_num_reqs
        lengths = np.zeros(W * rows, dtype=np.int64)
        held: dict[int, tuple[int, int, int]] = {}
        for rid, n in written.items():
            row = run.requests[rid].row
            assert row is not None  # it computed tokens this step: it holds a row
            p = np.arange(n)
            owner = (p % (lay.kv_block_size * W)) // lay.interleave % W if W > 1 else np.zeros(n, np.int64)
            for R, local in enumerate(np.bincount(owner, minlength=W)):
                lengths[R * rows + row] = local
                held[R * rows + row] = (rid, R, int(local))
        self.gathered.append([held[i] for i in sorted(held)])
        cu = np.zeros(W * rows + 1, dtype=np.int32)
        cu[1:] = np.cumsum(lengths)
        total = int(cu[-1]) + PAD_ROWS
        item = np.dtype(HOST[self.out_dtype]).itemsize
        fill = np.full(total * kv.num_heads * kv.head_size * item, OUT_FILL, dtype=np.uint8)
        host_out = fill.view(HOST[self.out_dtype]).reshape(total, kv.num_heads, kv.head_size)
        ref_table = np.tile(run.reference.tables[g].device, (W, 1)) + self.table_shifts[g][0]
        out_k, out_v = host_out.copy(), host_out.copy()
        ref_kv.gather(self.ref[g].key, self.ref[g].value, ref_table, cu, out_k, out_v, **self.options())
        self.expected_out.append((out_k, out_v))
        self.gather_rows.append(int(cu[-1]) if kv.kv_cache_dtype == "fp8_e4m3" else 0)  # decoded: any NaN is NaN
        if int(cu[-1]):
            run.event(events.KV_GATHER)
        return cu

    def _gather(self, g: int, cu: torch.Tensor) -> list[torch.Tensor]:
        """The implementation's gather of group g, through its device table (`cu`: the
        cumulative lengths, on the device); returns its outputs, to bring back."""
        run, W = self.state, self.state.layouts[g].world
        shape = self.expected_out[g][0].shape
        device = run.impl.tables[g].device_tensor
        table = device if W == 1 else (device.repeat(W, 1) + self.table_shifts[g][1])
        dev_out = [filled(shape, self.out_dtype, OUT_FILL, run.backend) for _ in range(2)]  # no upload
        self._call("kv-gather", g, self.kernels.gather, self.impl[g].key, self.impl[g].value, table, cu, *dev_out,
                   **self.options())
        return [fetchable(t) for t in dev_out]

    def compare(self, back: list[np.ndarray]) -> None:
        """After the slot mappings: each group's whole cache memory, then its gathered
        rows. NaN encodings may differ where docs/contract.md §9 lets them (an fp8
        cache's elements, decoded rows), unless --strict-nan; nowhere else."""
        if self.errors:
            raise self.errors[0]
        strict = self.state.kernels.strict_nan
        for g, lay in enumerate(self.state.layouts):
            count, out_k, out_v = back[3 * g:3 * g + 3]
            if int(count[0]):  # the device found a difference: the whole memory comes back for the report
                want = bits(self.ref[g].flat)
                got = to_host([fetchable(self.impl[g].flat)])[0].view(want.dtype)
                elements = self.elements[g]
                differ, only_nans = differing(want, got, elements if elements is not None else False, strict)
                if not differ.any():
                    self._stray_write(g, want)
                i = int(np.argmax(differ))
                where, rank, slot = locate(self.ref[g], i, self.kv, lay.kernel_block_size, self.blocks_per_rank[g])
                error = Discrepancy("KV cache", f"{where}{self._owner(g, rank, slot)}: expected bits "
                                    f"{int(want[i]):#x}, found {int(got[i]):#x} ({int(differ.sum())} of "
                                    f"{want.size} cells differ)", group=g, index=(i,))
                error.notes += [NAN_NOTE] if only_nans else []
                raise error
            for name, expected, actual in (("key", self.expected_out[g][0], out_k),
                                           ("value", self.expected_out[g][1], out_v)):
                e = bits(expected)
                a = actual.view(e.dtype)
                rows = (np.arange(len(e)) < self.gather_rows[g])[:, None, None]
                differ, only_nans = differing(expected, actual.view(expected.dtype), rows, strict)
                if differ.any():
                    row, head, dim = (int(x) for x in np.argwhere(differ)[0])
                    error = Discrepancy("KV gather", f"{name} row {row} ({self._row(g, row)}) head {head} "
                                        f"dim {dim}: expected bits {int(e[row, head, dim]):#x}, read "
                                        f"{int(a[row, head, dim]):#x} ({int(differ.sum())} of {e.size} differ)",
                                        group=g, index=(row, head, dim))
                    error.notes += [NAN_NOTE] if only_nans else []
                    raise error

    def _stray_write(self, g: int, want: np.ndarray) -> None:
        """The device counted a difference the host does not see: the mirror no longer
        holds the reference's memory. Only the harness writes it, from the reference,
        so something else wrote into it, a kernel writing far outside its caches the
        likeliest; said as that, with the first cell changed."""
        mirror = to_host([self.mirrors[g].expected])[0].view(want.dtype)
        stray = np.flatnonzero(mirror != want)
        if not len(stray):
            raise AssertionError(f"harness: the device counted differing cells in group {g}'s cache memory, "
                                 f"and neither the caches nor the harness's copy of them differ on the host")
        i = int(stray[0])
        raise Discrepancy("KV cache", f"memory outside the caches was written: the harness's own device copy of "
                          f"the expected cache memory changed in {len(stray)} cells, first cell {i - GUARD} "
                          f"(expected bits {int(want[i]):#x}, found {int(mirror[i]):#x}); the caches themselves "
                          f"hold what they should", group=g, index=(i,))

    def _owner(self, g: int, rank: int | None, slot: int | None) -> str:
        """Which of this step's tokens the reference wrote into that slot, if any."""
        if rank is None or slot is None:
            return ""
        stacked = slot + rank * self.blocks_per_rank[g] * self.state.layouts[g].kernel_block_size
        hits = np.flatnonzero(self.step_slots[g] == stacked)
        if not len(hits):
            block = stacked // self.state.layouts[g].kernel_block_size
            copied = [src for src, dst in self.step_pairs[g] if dst == block]
            if copied:
                src_rank, src = divmod(copied[0], self.blocks_per_rank[g])
                return f", in a block this step copies from rank {src_rank} block {src}"
            return ", a slot this step does not write"
        rid, position = self.tokens[int(hits[0]) % len(self.tokens)]
        return f", where this step writes request {rid} position {position}"

    def _row(self, g: int, row: int) -> str:
        start = 0
        for rid, rank, n in self.gathered[g]:
            if row < start + n:
                return f"request {rid} rank {rank} local index {row - start}"
            start += n
        return f"a padding row past the last length, {start}"
