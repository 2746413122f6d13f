"""vLLM V2's block tables in the lockstep (docs/contract.md §10): a world with `v2` set
keeps, on both sides, one `BlockTables` per DCP rank beside the V1 tables, as each
rank's worker holds them, and drives them with the V2 kernels under test (ours by
default, or the plug-ins named by `--v2-append`, `--v2-gather`, `--v2-slots`).

The same program, expressed as V2 calls: a request takes a persistent slot when it is
admitted, forked or resumed, and keeps it until it finishes or is preempted (no move,
no swap: the V1 row operations change only the batch order). Its blocks are staged as
the V1 side appends them: with `overwrite` when its row is replaced (a new or resumed
request, a fork, a copy on write), appended otherwise. Each step then applies the
staged writes, gathers the rows into a batch order that is the V1 row order permuted
(a function of the step's index, so a replay permutes alike; V1's holes become `-1`
dummies, CUDA-graph padding becomes `num_reqs_padded`), and maps every token of every
group to its slot in one call.

After every operation the host counts and staged writes are compared; after every
step, every rank's whole persistent rows, device counts, input tables (stale columns
and rows past the batch included) and slot buffers, and the data: each group's values
are written through the V2 slot mappings into a cache of its own and every live
sequence is read back through the gathered input table, at its batch position.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch

from blocktable.checks import data_checks
from blocktable.device import upload_arrays
from blocktable.oracle import DeviceCache, Reads, poison_value
from blocktable.plugin import V2_CONTRACTS
from blocktable.properties.classes.table_v2 import DrivenV2
from blocktable.properties.compare import Discrepancy, Handed, assert_arrays_equal, raised, same_values
from blocktable.properties.lockstep import events
from blocktable.properties.lockstep.launch import planned_reads
from blocktable.properties.lockstep.state import State
from blocktable.properties.world import V2Config
from blocktable.reference import V2BlockTables as ReferenceTables
from blocktable.v2 import BlockTables, V2Kernels


def watched(kernels: V2Kernels, rank: int | None) -> V2Kernels:
    """The kernels, each call checked for a tensor it resized or re-pointed
    (properties/compare.py). The check runs inside BlockTables, right after the call:
    BlockTables itself slices its buffers as it returns them, and would fail first on
    a buffer the kernel changed."""
    def watch(kind: str, kernel: Callable) -> Callable:
        contract = V2_CONTRACTS[kind]

        @functools.wraps(kernel)
        def call(*args: Any, **kwargs: Any) -> None:
            handed = Handed.of(contract, args)
            kernel(*args, **kwargs)
            handed.check(f"V2 {kind}", rank=rank)
        return call

    return dataclasses.replace(kernels, append=watch("append", kernels.append),
                               gather=watch("gather", kernels.gather),
                               slot_mappings=watch("slots", kernels.slot_mappings))


class V2World:
    """Both sides' V2 tables (one per rank), each request's slot and the V2 data caches."""

    def __init__(self, state: State, config: V2Config, kernels: V2Kernels) -> None:
        world, layouts = state.world, state.layouts
        self.state = state
        G = len(layouts)
        K = [lay.kv_block_size for lay in layouts]
        B = [lay.kernel_block_size for lay in layouts]
        # The V1 row's width (docs/contract.md §2) in allocation blocks: both designs
        # hold the same rows.
        M = [state.reference.tables[g].width // lay.kernel_blocks_per_block for g, lay in enumerate(layouts)]
        self.enabled = config.enabled(G)
        W = world.cp_world_size
        shape = (K, world.max_num_reqs, world.max_num_batched_tokens, M)
        options: dict[str, Any] = dict(kernel_block_sizes=B, cp_size=W, cp_interleave=world.v2_interleave(),
                                       dcp_sharded=[g.sharded for g in world.groups],
                                       slot_mapping_enabled=self.enabled)
        self.reference = [ReferenceTables(*shape, cp_rank=R, **options) for R in range(W)]
        self.impl: list[BlockTables] = []
        cls = state.kernels.table_v2
        for R in range(W):
            rank = R if W > 1 else None
            if cls is None:
                self.impl.append(BlockTables(*shape, cp_rank=R, **options, backend=state.backend,
                                             kernels=watched(kernels, rank)))
                continue
            # The V2 table class under test (docs/contract.md §11), its own kernels included.
            names = ("block_sizes", "max_num_reqs", "max_num_batched_tokens", "max_num_blocks_per_group")
            arguments = dict(zip(names, shape), cp_rank=R, **options)
            self.impl.append(cast(BlockTables, DrivenV2.build(cls, state.kernels.class_name("table-v2"), rank,
                                                              arguments, self.reference[R].widths,
                                                              state.backend.device)))
        self.slot: dict[int, int] = {}  # request -> its persistent slot (the harness's bookkeeping)
        self.caches = [DeviceCache(world.num_blocks * lay.kv_block_size, slot_base=world.id_offset * lay.kv_block_size,
                                   ranks=lay.world, backend=state.backend) for lay in layouts]
        self.batch: Batch | None = None  # the last step's batch, for the comparisons and the report
        if len(set(K)) > 1 or len(set(B)) > 1:
            state.event(events.V2_BLOCK_SIZES)
        if W > 1 and any(g.sharded for g in world.groups):
            state.event(events.V2_DCP)
        if not all(self.enabled):
            state.event(events.V2_SLOTS_OFF)

    # ---- host side: the staging of every operation ----------------------------------

    def stage(self, rid: int, ids: list[list[int]], overwrite: bool) -> None:
        """Request rid's blocks per group (table ids), on every rank's tables: its whole
        rows with `overwrite`, else the blocks it gained. A request without a slot
        takes the lowest free one."""
        if rid not in self.slot:
            taken = set(self.slot.values())
            self.slot[rid] = next(r for r in range(self.state.world.max_num_reqs) if r not in taken)
        r = self.slot[rid]
        for ref, ours in zip(self.reference, self.impl):
            self.state.both("V2 append_block_ids", functools.partial(ref.append_block_ids, r, ids, overwrite),
                            functools.partial(ours.append_block_ids, r, ids, overwrite), group=None)
        if overwrite:
            self.state.event(events.V2_OVERWRITE)
        ref = self.reference[0]
        if any(int(ref.cnt[g, r]) == ref.widths[g] for g in range(ref.num_groups)):
            self.state.event(events.V2_ROW_FULL)

    def release(self, rid: int) -> None:
        """A finished or preempted request gives its slot up (its rows stay, stale)."""
        self.slot.pop(rid, None)

    def check_host(self) -> None:
        """After every operation: the host counts and the staged writes, every rank."""
        for R, (ref, ours) in enumerate(zip(self.reference, self.impl)):
            rank = R if len(self.reference) > 1 else None
            assert_arrays_equal("V2 host counts", ref.cnt, ours.cnt, rank=rank)
            if isinstance(ours, DrivenV2):  # a class's staging is its own: what it does is compared after a step
                continue
            if [tuple(w) for w in ref.staged] != [(g, r, s, list(i)) for g, r, s, i in ours.staged]:
                raise Discrepancy("V2 staged writes", f"expected {ref.staged}, staged {ours.staged}", rank=rank)

    # ---- device side: one step ---------------------------------------------------------

    def launch(self, qsl: np.ndarray, positions: np.ndarray, values: np.ndarray, N: int, N_pad: int,
               pairs: list[list[tuple[int, int]]], written: dict[int, int]) -> list[torch.Tensor]:
        """The step as V2 calls on both sides, every rank; what to bring back."""
        state = self.state
        batch = self.batch = Batch.of(state, self.slot, qsl, positions, values, N, N_pad)
        if batch.permuted:
            state.event(events.V2_PERMUTED)
        if (batch.idx < 0).any():
            state.event(events.V2_DUMMY)
        if any(batch.qsl[b + 1] > batch.qsl[b] for b in range(len(batch.idx)) if batch.idx[b] < 0):
            state.event(events.V2_DUMMY_TOKENS)
        if N_pad > N:
            state.event(events.V2_PADDED)
        self.held, rows, self.read_positions = planned_reads(state, written, batch.position.__getitem__)
        # One upload: the batch in the dtypes the calls take, and the reads (docs/contract.md §10.5).
        idx_dev, qsl_dev, pos_dev, values_dev, sent_reads = upload_arrays(
            [batch.idx, batch.qsl, batch.positions, batch.values, Reads.packed(rows, self.read_positions)],
            state.backend)
        reads = Reads.received(rows, self.read_positions, sent_reads) if len(rows) else None
        for R, (ref, ours) in enumerate(zip(self.reference, self.impl)):
            rank = R if len(self.impl) > 1 else None
            ref.apply_staged_writes()
            ref.gather_block_tables(batch.idx, N_pad)
            if R == 0 and any((ref.inp[g][b, int(ref.cnt_dev[g, r]):] != 0).any()
                              for g in range(ref.num_groups) for b, r in enumerate(batch.idx) if r >= 0):
                state.event(events.V2_STALE)
            ref.compute_slot_mappings(batch.idx, batch.qsl, batch.positions, batch.tokens_padded)
            # BlockTables' data checks read the device back (a sync each); the
            # harness's batches are valid by construction, so, as for the V1 kernel
            # (lockstep/launch.py), they run on a program's first step only.
            with data_checks(state.steps_checked == 0):
                self._call("apply_staged_writes", rank, ours.apply_staged_writes)
                tables = self._call("gather_block_tables", rank, ours.gather_block_tables, idx_dev, N_pad)
                slots = self._call("compute_slot_mappings", rank, ours.compute_slot_mappings, idx_dev, qsl_dev,
                                   pos_dev, batch.tokens_padded)
            # §10.9: a captured graph reads the persistent buffers, so the results must be them.
            views = [(t, whole) for t, whole in zip((*tables, slots), (*ours.inp, ours.slots)) if t.numel()]
            if any(t.data_ptr() != whole.data_ptr() for t, whole in views):
                raise Discrepancy("V2 results", "gather_block_tables or compute_slot_mappings returned a copy, "
                                                "not views of the persistent buffers", rank=rank)
        out: list[torch.Tensor] = []
        for ours in self.impl:
            out += [*ours.rows, ours.cnt_dev, *ours.inp, ours.slots]
        return out + self._data(pairs, values_dev, reads)

    def _call(self, what: str, rank: int | None, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Discrepancy:  # a kernel that changed a tensor it was handed (watched below)
            raise
        except Exception as e:  # a kernel that refuses valid input is wrong too
            raise raised(f"V2 {what}", e, rank=rank) from e

    def _data(self, pairs: list[list[tuple[int, int]]], values: torch.Tensor,
              reads: Reads | None) -> list[torch.Tensor]:
        """Each enabled group's values written through the V2 slots of every rank that
        holds the group, then every live sequence read back (`reads`) through the
        gathered input table at its batch position."""
        state, offset = self.state, self.state.world.id_offset
        out = []
        for g, lay in enumerate(state.layouts):
            if not self.enabled[g]:
                continue
            cache = self.caches[g]
            cache.copy_blocks([(s + offset, d + offset) for s, d in pairs[g]], lay.kv_block_size)
            cache.write(torch.stack([self.impl[R].slots[g] for R in range(lay.world)]), values, check=False)
            if reads is not None:
                out.append(cache.read(self.impl[0].inp[g], reads, kv_block_size=lay.kv_block_size,
                                      kernel_block_size=lay.kernel_block_size, cp_world_size=lay.world,
                                      cp_interleave=lay.interleave))
        return out

    def compare(self, back: list[np.ndarray]) -> None:
        """Every rank's whole V2 state against the reference's, then the data."""
        batch = self.batch
        assert batch is not None
        G = len(self.state.layouts)
        parts = iter(back)
        for R, ref in enumerate(self.reference):
            rank = R if len(self.reference) > 1 else None
            rows, cnt_dev, inp, slots = [next(parts) for _ in range(G)], next(parts), \
                [next(parts) for _ in range(G)], next(parts)
            for g in range(G):
                assert_arrays_equal("V2 persistent rows", ref.rows[g], rows[g], group=g, rank=rank)
            assert_arrays_equal("V2 device counts", ref.cnt_dev, cnt_dev, rank=rank)
            for g in range(G):
                assert_arrays_equal("V2 input table", ref.inp[g], inp[g], group=g, rank=rank)
            try:
                assert_arrays_equal("V2 slot mappings", ref.slots, slots, rank=rank)
            except Discrepancy as error:
                if error.index is not None:
                    error.notes.append(batch.token_note(self.state, error.index[1]))
                raise
        self._compare_reads(list(parts))

    def _compare_reads(self, back: list[np.ndarray]) -> None:
        if not self.held:
            return
        state = self.state
        want = np.concatenate([np.array(state.history[rid][:n], dtype=np.int64) for rid, n in self.held])
        owners = np.repeat(np.array([rid for rid, _ in self.held]), [n for _, n in self.held])
        poison = poison_value()
        groups = [g for g in range(len(state.layouts)) if self.enabled[g]]
        for g, got in zip(groups, back):
            merged = np.where(got != poison, got, 0).sum(axis=0)
            ranks = (got != poison).sum(axis=0)
            if (ranks != 1).any() or not same_values(merged, want):
                i = int(np.argmax((ranks != 1) | (merged != want)))
                raise Discrepancy("V2 data read-back",
                                  f"request {owners[i]} position {self.read_positions[i]} (batch position "
                                  f"{self.batch.position[int(owners[i])] if self.batch else '?'}): expected value "
                                  f"{want[i]}, read {merged[i]} from {ranks[i]} rank(s)", group=g)


class Batch:
    """One step's batch in V2 terms: V1's rows [0, N) in a permuted order, the slot
    (or -1) of each batch position, the tokens in batch order."""

    def __init__(self, order: np.ndarray, idx: np.ndarray, qsl: np.ndarray, positions: np.ndarray,
                 values: np.ndarray, tokens_padded: int, rows: list[int | None]) -> None:
        self.order, self.idx, self.qsl, self.positions, self.values = order, idx, qsl, positions, values
        self.tokens_padded = tokens_padded
        self.rows = rows  # the request of each batch position (None: a dummy)
        self.position = {rid: b for b, rid in enumerate(rows) if rid is not None}
        self.permuted = bool(len(order) > 1 and (order != np.arange(len(order))).any())

    @classmethod
    def of(cls, state: State, slot: dict[int, int], qsl: np.ndarray, positions: np.ndarray, values: np.ndarray,
           N: int, N_pad: int) -> Batch:
        # A function of the step's index alone: a replay of the program permutes alike.
        rng = np.random.default_rng(state.steps_checked)
        order = rng.permutation(N) if N > 1 else np.arange(N)
        rows = [state.rows[int(r)] for r in order]
        idx = np.array([slot[rid] if rid is not None else -1 for rid in rows],
                       dtype=np.int64 if state.steps_checked % 2 else np.int32)  # both dtypes §10.5 allows
        # A dummy may carry tokens of its own (a runner's padding requests do, vLLM
        # #56734): up to two, where the token budget has room. They map to -1 and write
        # nothing; their positions and values are arbitrary.
        room = state.world.max_num_batched_tokens - len(positions)
        chunks, parts, value_parts = [], [], []
        for b, r in enumerate(order):
            if rows[b] is None:
                k = min((state.steps_checked + b) % 3, room)
                room -= k
                parts.append(np.arange(b, b + k, dtype=np.int64))
                value_parts.append(np.zeros(k, dtype=np.int64))
            else:
                parts.append(positions[qsl[r]:qsl[r + 1]])
                value_parts.append(values[qsl[r]:qsl[r + 1]])
            chunks.append(len(parts[-1]))
        new_qsl = np.zeros(N + 1, dtype=np.int32)
        new_qsl[1:] = np.cumsum(chunks, dtype=np.int64)
        T = int(new_qsl[-1])
        tokens_padded = min(state.world.max_num_batched_tokens, T + (N_pad - N))
        join = (lambda xs: np.concatenate(xs)) if N else (lambda xs: np.zeros(0, np.int64))
        return cls(order, idx, new_qsl, join(parts), join(value_parts), tokens_padded, rows)

    def token_note(self, state: State, t: int) -> str:
        """Slot-mapping column t in the user's terms."""
        T = int(self.qsl[-1])
        if t >= T:
            return f"column {t} lies past the step's {T} tokens: it must be -1 (padding)"
        b = int(np.searchsorted(self.qsl, t, side="right")) - 1
        rid = self.rows[b]
        who = f"request {rid} in slot {int(self.idx[b])}" if rid is not None else "a dummy (-1)"
        return f"column {t} is token {t - int(self.qsl[b])} of batch position {b}, {who}, position " \
               f"{int(self.positions[t])}"
