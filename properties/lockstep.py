"""The paired checking object: the reference and the implementation side by side,
every step applied to both and everything compared after it (docs/contract.md §3-§7).

A step is a plain dict ({"op": "step", "query": [...], "pad": 1}), so a run is a
list of steps: Hypothesis generates them (properties/machine.py), case files store
them, `blocktable replay` re-applies them. Each step is announced to `on_step`
before it runs (the crash journal), and after it the whole state is compared:

- every group's table: host rows, counts, committed device rows (whole buffers);
- the pool: ref counts and the free queue in order; every sequence's block list;
- docs/contract.md §6's invariants on the reference;
- on `step`: the kernel under test against the reference slot mapping on every
  group and every DCP rank (whole [Tmax] outputs), copy-on-write pairs, and the
  data-level oracle: every live sequence read back through the device table and
  the paged caches equals its history, each token held by exactly one rank.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import torch

from blocktable.checks import data_checks
from blocktable.device import Backend, to_host, upload
from blocktable.groups import MultiGroupBlockTable
from blocktable.oracle import DeviceCache, Reads, poison_value
from blocktable.plugin import SlotMappingFn
from blocktable.pool import BlockPool
from blocktable.properties import fault
from blocktable.properties.compare import (Discrepancy, assert_arrays_equal, assert_pool_equal,
                                           assert_table_equal, check_slot_mapping, same_values)
from blocktable.properties.guard import StagedCall
from blocktable.properties.world import WorldConfig
from blocktable.reference import (BlockPool as ReferencePool, History, MultiGroupBlockTable as ReferenceGroups,
                                  SequenceBlocks as ReferenceSequences,
                                  slot_mappings_all_ranks as reference_slot_mappings)
from blocktable.sequence import SequenceBlocks
from blocktable.table import BlockTable

TILE = 1024  # the kernels' token tile


@dataclass
class Request:
    id: int
    row: int | None = None
    written: int = 0  # positions [0, written) hold their values on the device
    depth: int = 0  # fork generations
    preempted: bool = False


class Lockstep:
    """One run: build both sides from `world`, then `apply` steps."""

    OPS = ("add", "step", "fork", "finish", "preempt", "resume", "move", "swap", "condense", "reject")

    def __init__(self, world: WorldConfig, kernel: SlotMappingFn, backend: Backend,
                 on_step: Callable[[dict[str, Any]], None] | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        self.world = world
        self.kernel = kernel
        self.backend = backend
        self.on_step = on_step
        self.on_event = on_event
        self.layouts = world.layouts()
        self.events: Counter[str] = Counter()
        self.program: list[dict[str, Any]] = []
        self.steps_checked = 0
        self.steps_with_tokens = 0  # of those, steps that scheduled at least one token
        self.failed_at: float | None = None  # when a step first failed (time.monotonic)

        # The reference side.
        self.ref_pool = ReferencePool(world.num_blocks, world.null_block)
        self.ref_seqs = [ReferenceSequences(self.ref_pool, lay.tokens_per_block) for lay in self.layouts]
        self.ref_tables = ReferenceGroups(world.max_num_reqs, world.max_model_len, self.layouts)
        self.history = History()
        # The implementation side.
        self.pool = BlockPool(world.num_blocks, world.null_block)
        self.seqs = [SequenceBlocks(self.pool, lay.tokens_per_block) for lay in self.layouts]
        self.tables = MultiGroupBlockTable([
            BlockTable(world.max_num_reqs, world.max_model_len, kv_block_size=g.kv_block_size,
                       kernel_block_size=g.kernel_block_size, sharded=g.sharded, cp_world_size=world.cp_world_size,
                       cp_interleave=g.cp_interleave, backend=backend) for g in world.groups])
        self.caches = [DeviceCache(world.num_blocks * lay.kv_block_size, slot_base=world.id_offset * lay.kv_block_size,
                                   ranks=lay.world, backend=backend) for lay in self.layouts]
        # The harness's own bookkeeping (neither side): which request sits in which row.
        self.rows: list[int | None] = [None] * world.max_num_reqs
        self.requests: dict[int, Request] = {}
        self.next_request = 0
        self.next_value = 1
        self._invariants_held: tuple | None = None  # the state docs/contract.md §6's invariants last held in
        self._device_rows: list[np.ndarray] | None = None  # the device tables, read back at the end of a step
        self.check()

    # -- plumbing ---------------------------------------------------------------------

    def apply(self, step: dict[str, Any]) -> Any:
        op = step.get("op")
        if op not in self.OPS:
            raise ValueError(f"unknown step {step!r}")
        if self.on_step is not None:
            self.on_step(step)
        self.program.append(dict(step))
        args = {k: v for k, v in step.items() if k != "op"}
        self._device_rows = None
        try:
            result = getattr(self, f"_{op}")(**args)
            self.check()
        except Exception as error:
            fault.check(error)
            if self.failed_at is None:
                self.failed_at = time.monotonic()
            raise
        return result

    def event(self, label: str) -> None:
        self.events[label] += 1
        if self.on_event is not None:
            self.on_event(label)

    def ids(self, blocks: list[int]) -> list[int]:
        """Pool ids -> table ids."""
        return [b + self.world.id_offset for b in blocks]

    def free_row(self) -> int | None:
        return next((r for r, rid in enumerate(self.rows) if rid is None), None)

    def live(self) -> list[int]:
        """Requests holding a row, in row order."""
        return [rid for rid in self.rows if rid is not None]

    def growable(self) -> bool:
        """Some running request has a token left to compute (a recompute after a
        resume, or room before max_model_len)."""
        return any(self.requests[rid].written < self.slots(rid) or self.slots(rid) < self.world.max_model_len
                   for rid in self.live())

    def condensable(self) -> bool:
        """Some occupied row lies past a hole (otherwise condense changes nothing)."""
        holes = [r for r, rid in enumerate(self.rows) if rid is None]
        return bool(holes) and any(rid is not None for rid in self.rows[holes[0]:])

    def preempted(self) -> list[int]:
        return sorted(rid for rid, req in self.requests.items() if req.preempted)

    def slots(self, rid: int) -> int:
        return self.ref_seqs[0].num_tokens[rid]

    def _place(self, rid: int, row: int, blocks_per_group: list[list[int]]) -> None:
        before = [int(t.count[row]) for t in self.ref_tables.tables]
        ids = [self.ids(b) for b in blocks_per_group]
        self.ref_tables.add_row(ids, row)
        self.tables.add_row(ids, row)
        if any(int(t.count[row]) < b for t, b in zip(self.ref_tables.tables, before)):
            self.event("row reused shorter")
        self.rows[row] = rid
        self.requests[rid].row = row

    # -- the comparisons after every step -----------------------------------------------

    def check(self) -> None:
        # A step reads the device tables back with its data, after its last launch.
        device_rows, self._device_rows = self._device_rows, None
        if device_rows is None:
            device_rows = to_host([self.tables[g].device_tensor for g in range(len(self.layouts))])
        for g, rows in enumerate(device_rows):
            assert_table_equal(f"group {g} table", self.ref_tables[g], self.tables[g], rows)
        assert_pool_equal("pool", self.ref_pool, self.pool)
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            if ref.blocks != impl.blocks:
                raise Discrepancy(f"group {g} sequence blocks", f"expected {ref.blocks}, got {impl.blocks}")
            if ref.num_tokens != impl.num_tokens:
                raise Discrepancy(f"group {g} sequence lengths", f"expected {ref.num_tokens}, got {impl.num_tokens}")
        # docs/contract.md §6's invariants are a function of the ref counts, the free queue and the
        # live tables alone: checked again whenever any of them changed (a swap, a
        # move or a refused call changes none of them, and neither does a decode
        # step inside a block).
        state = (self.ref_pool.ref.tobytes(), self.ref_pool.free_queue, [s.blocks for s in self.ref_seqs])
        if state != self._invariants_held:  # compared in place; copied only when it changed
            self.ref_pool.check_invariants([table for s in self.ref_seqs for table in s.live_tables()])
            self._invariants_held = (state[0], list(state[1]),
                                     [{rid: list(blocks) for rid, blocks in s.blocks.items()} for s in self.ref_seqs])

    def _both(self, what: str, ref_call: Callable[[], Any], impl_call: Callable[[], Any]) -> tuple[Any, Any]:
        """Run a call on both sides; they must both succeed or both raise the same type."""
        outcomes = []
        for call in (ref_call, impl_call):
            try:
                outcomes.append((None, call()))
            except (ValueError, TypeError) as e:
                outcomes.append((e, None))
        (ref_err, ref_out), (impl_err, impl_out) = outcomes
        if type(ref_err) is not type(impl_err):
            raise Discrepancy(what, f"the reference {'raised ' + repr(ref_err) if ref_err else 'succeeded'}, "
                                    f"the implementation {'raised ' + repr(impl_err) if impl_err else 'succeeded'}")
        if ref_err is not None:
            raise ref_err
        return ref_out, impl_out

    # -- operations ----------------------------------------------------------------------

    def _add(self) -> int:
        row = self.free_row()
        if row is None:
            raise ValueError("add: every row is taken")
        rid = self.next_request
        self.next_request += 1
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            r, i = self._both(f"group {g} add", lambda: ref.add(rid, 0), lambda: impl.add(rid, 0))
        self.requests[rid] = Request(rid)
        self.history.add(rid)
        self._place(rid, row, [[] for _ in self.layouts])
        return rid

    def _fork(self, parent: int) -> int:
        row = self.free_row()
        req = self.requests[parent]
        if row is None or req.row is None or req.written != self.slots(parent):
            raise ValueError(f"fork: request {parent} must be running and fully written, and a row free")
        child = self.next_request
        self.next_request += 1
        blocks = []
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            r, i = self._both(f"group {g} fork", lambda: ref.fork(parent, child), lambda: impl.fork(parent, child))
            if r != i:
                raise Discrepancy(f"group {g} fork", f"child blocks: expected {r}, got {i}")
            blocks.append(r)
        self.requests[child] = Request(child, written=req.written, depth=req.depth + 1)
        self.history.fork(parent, child)
        self._place(child, row, blocks)
        if req.depth + 1 >= 2:
            self.event("fork depth >= 2")
        if self.ref_pool.ref.max() >= 3:  # only a fork raises a ref
            self.event("ref >= 3")
        return child

    def _finish(self, request: int, clear: bool = False) -> None:
        req = self.requests.pop(request)
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            self._both(f"group {g} free", lambda: ref.free(request), lambda: impl.free(request))
        self.history.drop(request)
        if req.row is not None:
            if clear:
                self.ref_tables.clear_row(req.row)
                self.tables.clear_row(req.row)
            else:
                self.event("finished row left stale")
            self.rows[req.row] = None

    def _preempt(self, request: int) -> None:
        req = self.requests[request]
        if req.row is None:
            raise ValueError(f"preempt: request {request} is not running")
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            self._both(f"group {g} preempt", lambda: ref.preempt(request), lambda: impl.preempt(request))
        self.rows[req.row] = None
        req.row, req.written, req.preempted = None, 0, True

    def _resume(self, request: int) -> None:
        row = self.free_row()
        req = self.requests[request]
        if row is None or not req.preempted:
            raise ValueError(f"resume: request {request} must be preempted, and a row free")
        # The groups share one pool: resume only if every group's allocation fits,
        # as a scheduler would (the request stays waiting otherwise).
        need = sum(-(-self.slots(request) // lay.tokens_per_block) for lay in self.layouts)
        if need > self.ref_pool.num_free:
            self.event("pool exhausted")
            return
        blocks = []
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            r, i = self._both(f"group {g} resume", lambda: ref.resume(request), lambda: impl.resume(request))
            if r != i:
                raise Discrepancy(f"group {g} resume", f"blocks: expected {r}, got {i}")
            blocks.append(r)
        req.preempted = False
        self._place(request, row, blocks)  # replaced with add_row, never appended to
        self.event("resumed (recompute)")

    def _move(self, src: int, dst: int) -> None:
        if dst != src and self.rows[dst] is not None:
            raise ValueError(f"move: destination row {dst} holds request {self.rows[dst]}")
        self.ref_tables.move_row(src, dst)
        self.tables.move_row(src, dst)
        if src == dst:
            self.event("self-move")
            return
        self.rows[dst], self.rows[src] = self.rows[src], None
        if self.rows[dst] is not None:
            self.requests[self.rows[dst]].row = dst

    def _swap(self, a: int, b: int) -> None:
        self.ref_tables.swap_row(a, b)
        self.tables.swap_row(a, b)
        if a == b:
            self.event("self-swap")
        self.rows[a], self.rows[b] = self.rows[b], self.rows[a]
        for r in (a, b):
            if self.rows[r] is not None:
                self.requests[self.rows[r]].row = r

    def _condense(self) -> None:
        """vLLM's condense: move the last occupied rows into the first holes."""
        while True:
            holes = [r for r, rid in enumerate(self.rows) if rid is None]
            occupied = [r for r, rid in enumerate(self.rows) if rid is not None]
            if not holes or not occupied or holes[0] > occupied[-1]:
                return
            self._move(occupied[-1], holes[0])

    def _reject(self, kind: str, which: int = 0) -> None:
        """A bad call on both sides: both must refuse it with the same error type and
        change nothing (the comparisons after the step see any change)."""
        g = which % len(self.layouts)
        if kind == "row-overflow":
            row = which % self.world.max_num_reqs
            ref, impl = self.ref_tables[g], self.tables[g]
            P = self.layouts[g].kernel_blocks_per_block
            n = -(-(ref.width - int(ref.count[row]) + 1) // P)
            ids = self.ids([1 if self.world.null_block else 0] * n)
            calls = (lambda: ref.append_row(ids, row), lambda: impl.append_row(ids, row))
        elif kind == "double-free":
            queue = self.ref_pool.free_queue
            if not queue:
                return
            b = queue[which % len(queue)]
            calls = (lambda: self.ref_pool.free([b]), lambda: self.pool.free([b]))
        elif kind == "free-duplicate":
            held = [b for s in self.ref_seqs for t in s.live_tables() for b in t]
            if not held:
                return
            b = held[which % len(held)]
            calls = (lambda: self.ref_pool.free([b, b]), lambda: self.pool.free([b, b]))
        elif kind == "over-allocate":
            n = self.ref_pool.num_free + 1
            calls = (lambda: self.ref_pool.allocate(n), lambda: self.pool.allocate(n))
        elif kind == "fork-unknown":
            ghost = self.next_request + 1000
            calls = (lambda: self.ref_seqs[g].fork(ghost, ghost + 1), lambda: self.seqs[g].fork(ghost, ghost + 1))
        else:
            raise ValueError(f"unknown rejection {kind!r}")
        try:
            self._both(f"rejection {kind}", *calls)
        except ValueError:
            self.event(f"rejected {kind}")
            return
        raise Discrepancy(f"rejection {kind}", "both sides accepted a call that must be refused")

    # -- the scheduling step -----------------------------------------------------------

    def _step(self, query: list[int], pad: int = 0) -> None:
        occupied = [r for r, rid in enumerate(self.rows) if rid is not None]
        N = occupied[-1] + 1 if occupied else 0
        budget = self.world.max_num_batched_tokens
        chunks: list[int] = []
        for r in range(N):
            rid = self.rows[r]
            q = query[r] if r < len(query) else 0
            chunks.append(0 if rid is None else self._grow(rid, r, min(q, budget)))
            budget -= chunks[-1]

        self.ref_tables.commit(N)
        self.tables.commit(N)
        N_pad = min(N + pad, self.world.max_num_reqs)
        padded = []  # (group, expected, the returned device rows): read back with the step's data
        if N_pad > N:
            self.event("cuda-graph padding")
            padded = [(g, self.ref_tables[g].pad_for_cuda_graph(N, N_pad),
                       self.tables[g].pad_for_cuda_graph(N, N_pad)) for g in range(len(self.layouts))]

        qsl = np.zeros(N + 1, dtype=np.int32)
        qsl[1:] = np.cumsum(chunks, dtype=np.int64)
        positions_parts, value_parts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for r, chunk in enumerate(chunks):
            if not chunk:
                continue
            req = self.requests[self.rows[r]]
            start, stop = req.written, req.written + chunk
            again = self.history[req.id][start:stop]  # recompute: the same tokens, the same values
            fresh = chunk - len(again)
            positions_parts.append(np.arange(start, stop, dtype=np.int64))
            value_parts += [np.array(again, dtype=np.int64),
                            np.arange(self.next_value, self.next_value + fresh, dtype=np.int64)]
            self.next_value += fresh
        positions_np, values = np.concatenate(positions_parts), np.concatenate(value_parts)
        if any(c > TILE or (s // TILE != (s + c - 1) // TILE) for s, c in zip(qsl[:-1], chunks) if c):
            self.event("tile crossing")
        if self.world.id_offset:
            self.event("ids offset toward 2**31-1")

        # Everything is launched first and comes back in one copy (each read-back waits
        # for the device): every group's kernel calls, copy-on-write copies and cache
        # writes, then every live sequence's read-back.
        values_device = upload(torch.from_numpy(values), self.backend)  # one upload for every group
        padded_back = None
        try:
            calls = self._launch_groups(qsl, positions_np, values_device, N)
            written = {self.rows[r]: self.requests[self.rows[r]].written + chunk
                       for r, chunk in enumerate(chunks) if chunk}
            reads = self._launch_reads(written)
            tables = [self.tables[g].device_tensor for g in range(len(self.layouts))]
            # The tables come back once: for the guard checks and the comparisons after the step.
            back = to_host(tables + [call.readback()[0] for call in calls] + [rows for _, _, rows in padded]
                           + reads.tensors)
            G, P = len(tables), len(padded)
            device_rows, handed, padded_back = back[:G], back[G:2 * G], back[2 * G:2 * G + P]
            for g, call in enumerate(calls):
                self._check_group(g, call, [handed[g], device_rows[g]], qsl, positions_np, N)
        except Discrepancy:
            self._check_padded(padded, padded_back)  # a padding that broke the table explains what the kernel did next
            raise
        for r, chunk in enumerate(chunks):
            if chunk:
                req = self.requests[self.rows[r]]
                self.history.write(req.id, req.written, values[int(qsl[r]):int(qsl[r]) + chunk])
                req.written += chunk
        self._device_rows = device_rows  # for the comparisons after the step
        self._check_padded(padded, padded_back)
        self._compare_reads(reads, back[2 * G + P:])
        self.steps_checked += 1
        self.steps_with_tokens += bool(len(positions_np))

    def _grow(self, rid: int, row: int, q: int) -> int:
        """How many tokens request rid computes this step, allocating (and copying on
        write) for new ones. Recompute after a resume needs no allocation."""
        req = self.requests[rid]
        have = self.slots(rid)
        if req.written < have:
            return min(q, have - req.written)
        q = min(q, self.world.max_model_len - have)
        if q <= 0:
            return 0
        need = [(ref.blocks_needed(rid, q), impl.blocks_needed(rid, q)) for ref, impl in zip(self.ref_seqs, self.seqs)]
        if any(a != b for a, b in need):
            raise Discrepancy("blocks needed", f"request {rid} growing by {q}: expected {[a for a, _ in need]}, "
                                               f"got {[b for _, b in need]}")
        if sum(a for a, _ in need) > self.ref_pool.num_free:
            self.event("pool exhausted")
            return 0
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            r, i = self._both(f"group {g} append", lambda: ref.append(rid, q), lambda: impl.append(rid, q))
            if (r.cow, r.new) != (i.cow, i.new):
                raise Discrepancy(f"group {g} append", f"request {rid} growing by {q}: expected copy {r.cow} and "
                                                       f"new blocks {r.new}, got copy {i.cow} and new blocks {i.new}")
            if r.cow is not None:
                self.event("copy-on-write")
                ids = self.ids(ref.blocks[rid])
                self.ref_tables[g].add_row(ids, row)
                self.tables[g].add_row(ids, row)
            else:
                ids = self.ids(r.new)
                self.ref_tables[g].append_row(ids, row)
                self.tables[g].append_row(ids, row)
            if int(self.ref_tables[g].count[row]) == self.ref_tables[g].width:
                self.event("row filled to its width")
        return q

    def _launch_groups(self, qsl: np.ndarray, positions: np.ndarray, values: torch.Tensor, N: int) -> list[StagedCall]:
        """Every group's kernel calls (all its ranks, on one set of guarded inputs), then
        its copy-on-write copies and the writes of the step's values into its paged
        caches through the slot mappings the kernel returned. The writes are not
        checked on their own (a device sync each): every slot is compared with the
        reference's before the data read back is, which is the clearer report, and a
        wrong slot is skipped or lands in a wrong place, never outside the cache."""
        pairs = []
        for g in range(len(self.layouts)):
            ref_pairs, impl_pairs = self.ref_seqs[g].take_cow_pairs(), self.seqs[g].take_cow_pairs()
            if ref_pairs != impl_pairs:
                raise Discrepancy(f"group {g} copy-on-write pairs", f"expected {ref_pairs}, got {impl_pairs}")
            pairs.append(ref_pairs)
        calls = [self._slot_calls(g, qsl, positions, N, range(lay.world)) for g, lay in enumerate(self.layouts)]
        for g, call in enumerate(calls):
            cache, offset = self.caches[g], self.world.id_offset
            cache.copy_blocks([(s + offset, d + offset) for s, d in pairs[g]], self.layouts[g].kv_block_size)
            cache.write(call.outputs, values, check=False)
        return calls

    def _check_group(self, g: int, call: StagedCall, back: list[np.ndarray], qsl: np.ndarray, positions: np.ndarray,
                     N: int) -> None:
        """Group g's guards and inputs as they were (else: whose call broke them, each
        rank alone), and its slot mappings against the reference."""
        try:
            actual = call.check(back)
        except Discrepancy:
            for R in range(self.layouts[g].world if self.layouts[g].world > 1 else 0):
                self._slot_calls(g, qsl, positions, N, [R]).check()
            raise
        self._compare_slots(g, qsl, positions, N, actual)

    def _slot_config(self, g: int) -> dict[str, int]:
        lay = self.layouts[g]
        return dict(kv_block_size=lay.kv_block_size, kernel_block_size=lay.kernel_block_size, cp_world_size=lay.world,
                    cp_interleave=lay.interleave)

    def _compare_slots(self, g: int, qsl: np.ndarray, positions: np.ndarray, N: int, actual: np.ndarray) -> None:
        """Group g's slot mapping of every rank against the reference (whole [Tmax] outputs)."""
        kw = self._slot_config(g)
        W = kw["cp_world_size"]
        every_rank = reference_slot_mappings(qsl, positions, self.ref_tables[g].device,
                                             self.world.max_num_batched_tokens, **kw)
        for R in range(W):
            expected = every_rank[R]
            check_slot_mapping(f"group {g} rank {R} slot mapping", expected, actual[R], group=g, rank=R,
                               config=dict(cp_rank=R, **kw), query_start_loc=qsl, positions=positions,
                               table=self.ref_tables[g].device, requests=self.rows[:N])
            if W > 1 and len(positions) and (expected[:len(positions)] < 0).any():
                self.event("non-local DCP tokens")

    def _slot_calls(self, g: int, qsl: np.ndarray, positions: np.ndarray, N: int, ranks: Iterable[int]) -> StagedCall:
        """The kernel under test on group g's committed table for each of `ranks`, all on
        one set of guarded inputs, each into its own guarded output. The guards are
        the caller's to check (every group's together: one device sync per step)."""
        ranks = list(ranks)
        kw = self._slot_config(g)
        call = StagedCall(self.tables[g].device_tensor, qsl, positions, self.world.max_num_batched_tokens,
                          outputs=tuple(f"group {g} rank {R} slot_mapping" for R in ranks),
                          label=f"group {g} rank {ranks[0]}" if len(ranks) == 1 else f"group {g}", slot=g)
        qsl_view, pos_view, table_view = call.inputs()
        for i, R in enumerate(ranks):
            try:
                # Our wrappers' data checks read query_start_loc and positions back (a
                # device sync). The harness's are valid by construction; the stateless
                # fuzzer runs the checks on every batch it draws and the unit tests on
                # invalid ones, so here they run on a program's first call only.
                with data_checks(self.steps_checked == 0 and g == 0 and i == 0):
                    self.kernel(qsl_view, pos_view, table_view, call.output(i), cp_rank=R, **kw)
            except Exception as e:  # a kernel that refuses valid input is wrong too
                raise Discrepancy(f"group {g} rank {R} slot mapping",
                                  f"the kernel raised {type(e).__name__}: {e}") from e
        return call

    def _check_padded(self, padded: list[tuple[int, np.ndarray, torch.Tensor]],
                      back: list[np.ndarray] | None = None) -> None:
        """The rows each group's pad_for_cuda_graph returned against the reference's;
        `back`: those rows already on the host (else read here)."""
        back = to_host([rows for _, _, rows in padded]) if back is None else back
        for (g, expected, _), rows in zip(padded, back):
            assert_arrays_equal(f"group {g} padded table", expected, rows)

    def _launch_reads(self, written: dict[int, int]) -> "_LaunchedReads":
        """docs/contract.md §7's read-back, launched: every live sequence's positions 0 .. its length
        after this step (`written`, for the requests that computed tokens), through
        each group's device table on every rank."""
        held = [(rid, written.get(rid, self.requests[rid].written)) for rid in self.live()]
        held = [(rid, n) for rid, n in held if n]
        if not held:
            return _LaunchedReads(held, np.zeros(0, np.int32), np.zeros(0, np.int64), [])
        counts = np.array([n for _, n in held])
        rows = np.repeat(np.array([self.requests[rid].row for rid, _ in held], dtype=np.int32), counts)
        # Each request's positions 0 .. n-1, all requests end to end.
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        positions = np.arange(len(rows), dtype=np.int64) - starts
        sent = Reads.send(rows, positions, self.backend)
        tensors = [self.caches[g].read(self.tables[g].device_tensor, sent, **self._slot_config(g))
                   for g in range(len(self.layouts))]
        return _LaunchedReads(held, rows, positions, tensors)

    def _compare_reads(self, reads: "_LaunchedReads", back: list[np.ndarray]) -> None:
        """Every live sequence, read through each group's device table on every rank,
        equals its history; each token is held by exactly one rank."""
        if not reads.held:
            return
        want = np.concatenate([np.array(self.history[rid][:n], dtype=np.int64) for rid, n in reads.held])
        poison = poison_value()
        for g, got in enumerate(back):
            ranks = (got != poison).sum(axis=0)
            if (ranks != 1).any():
                i = int(np.argmax(ranks != 1))
                raise Discrepancy(f"group {g} data read-back", f"position {reads.positions[i]} of request "
                                                               f"{self.rows[reads.rows[i]]} is held by {ranks[i]} ranks")
            merged = np.where(got != poison, got, 0).sum(axis=0)
            if not same_values(merged, want):
                i = int(np.argmax(merged != want))
                raise Discrepancy(f"group {g} data read-back",
                                  f"request {self.rows[reads.rows[i]]} position {reads.positions[i]}: expected value "
                                  f"{want[i]}, read {merged[i]} ({int((merged != want).sum())} of {len(want)} "
                                  f"values differ)")


@dataclass
class _LaunchedReads:
    """A step's read-back, launched: (request, length) of each sequence read, the
    row and position of each read, and each group's [ranks, reads] result."""

    held: list[tuple[int, int]]
    rows: np.ndarray
    positions: np.ndarray
    tensors: list[torch.Tensor]
