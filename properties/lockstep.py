"""The paired checking object: the reference and the implementation side by side,
every step applied to both and everything compared after it (docs/contract.md §3-§8).

A step is a plain dict ({"op": "step", "query": [...], "pad": 1}), so a run is a
list of steps: Hypothesis generates them (properties/machine.py), case files store
them, `blocktable replay` re-applies them. Each step is announced to `on_step`
before it runs (the crash journal), and after it the whole state is compared:
every group's table (host rows, counts, committed device rows, whole buffers); the
pool's ref counts and free queue in order, every sequence's blocks, the cache map
(properties/prefix_ops.py); the invariants on the reference; and on `step`, the
kernel's slot mappings, copy-on-write pairs and the data read back
(properties/device_step.py). Refused calls: properties/rejections.py; coverage
labels: properties/events.py.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from blocktable.device import Backend, to_host
from blocktable.groups import MultiGroupBlockTable
from blocktable.oracle import DeviceCache
from blocktable.plugin import SlotMappingFn
from blocktable.pool import BlockPool
from blocktable.properties import device_step, events, fault
from blocktable.properties.kv_world import KVWorld
from blocktable.properties.compare import Discrepancy, assert_pool_equal, assert_table_equal
from blocktable.properties.prefix_ops import PrefixCachingOps
from blocktable.properties.prompts import Prompts
from blocktable.properties.rejections import REJECTIONS
from blocktable.properties.world import WorldConfig
from blocktable.reference import (BlockPool as ReferencePool, History, MultiGroupBlockTable as ReferenceGroups,
                                  SequenceBlocks as ReferenceSequences)
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


class Lockstep(PrefixCachingOps):
    """One run: build both sides from `world`, then `apply` steps."""

    OPS = ("add", "step", "fork", "finish", "preempt", "resume", "move", "swap", "condense", "reject", "reset")

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
        caching = world.prefix_caching
        self.ref_pool = ReferencePool(world.num_blocks, world.null_block, prefix_caching=caching)
        self.ref_seqs = [ReferenceSequences(self.ref_pool, lay.tokens_per_block, group=g)
                         for g, lay in enumerate(self.layouts)]
        self.ref_tables = ReferenceGroups(world.max_num_reqs, world.max_model_len, self.layouts)
        self.history = History()
        self.prompts = Prompts() if caching else None  # token ids, in prefix-caching worlds only
        # The implementation side.
        self.pool = BlockPool(world.num_blocks, world.null_block, prefix_caching=caching)
        self.seqs = [SequenceBlocks(self.pool, lay.tokens_per_block, group=g) for g, lay in enumerate(self.layouts)]
        self.tables = MultiGroupBlockTable([
            BlockTable(world.max_num_reqs, world.max_model_len, kv_block_size=g.kv_block_size,
                       kernel_block_size=g.kernel_block_size, sharded=g.sharded, cp_world_size=world.cp_world_size,
                       cp_interleave=g.cp_interleave, backend=backend) for g in world.groups])
        self.caches = [DeviceCache(world.num_blocks * lay.kv_block_size, slot_base=world.id_offset * lay.kv_block_size,
                                   ranks=lay.world, backend=backend) for lay in self.layouts]
        self.kv = KVWorld(self, world.kv) if world.kv is not None else None  # docs/contract.md §9
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
            self.event(events.ROW_REUSED_SHORTER)
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
        listing = self._check_prefix_cache() if self.prompts is not None else None
        # The invariants (docs/contract.md §6, §8) are a function of the ref counts, the
        # free queue, the live tables and the cache map alone: checked again whenever
        # any of them changed (a swap, a move or a refused call changes none of them,
        # and neither does a decode step inside a block).
        state = (self.ref_pool.ref.tobytes(), self.ref_pool.free_queue, [s.blocks for s in self.ref_seqs], listing)
        if state != self._invariants_held:  # compared in place; copied only when it changed
            self.ref_pool.check_invariants([table for s in self.ref_seqs for table in s.live_tables()])
            if listing is not None:
                for s in self.ref_seqs:
                    s.check_cache_keys()
            self._invariants_held = (state[0], list(state[1]),
                                     [{rid: list(blocks) for rid, blocks in s.blocks.items()} for s in self.ref_seqs],
                                     listing)

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

    def _add(self, prompt: list[int] | None = None) -> int:
        row = self.free_row()
        if row is None:
            raise ValueError("add: every row is taken")
        if (prompt is not None) != (self.prompts is not None):
            raise ValueError("add: a request has a prompt exactly when the world caches prefixes")
        if prompt is not None:
            return self._add_prompt(row, list(prompt))
        rid = self.next_request
        self.next_request += 1
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            r, i = self._both(f"group {g} add", lambda: ref.add(rid, 0), lambda: impl.add(rid, 0))
        self._admit(rid, row, [[] for _ in self.layouts])
        return rid

    def _admit(self, rid: int, row: int, rows: list[list[int]], written: int = 0) -> None:
        self.requests[rid] = Request(rid, written=written)
        self.history.add(rid)
        self._place(rid, row, rows)

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
        if self.prompts is not None:
            self.prompts.fork(parent, child)
        self._place(child, row, blocks)
        if req.depth + 1 >= 2:
            self.event(events.FORK_DEPTH_2)
        if self.ref_pool.ref.max() >= 3:  # only a fork raises a ref
            self.event(events.REF_3)
        return child

    def _finish(self, request: int, clear: bool = False) -> None:
        req = self.requests.pop(request)
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            self._both(f"group {g} free", lambda: ref.free(request), lambda: impl.free(request))
        self.history.drop(request)
        if self.prompts is not None:
            self.prompts.drop(request)
        if req.row is not None:
            if clear:
                self.ref_tables.clear_row(req.row)
                self.tables.clear_row(req.row)
            else:
                self.event(events.STALE_ROW)
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
        if self.prompts is not None:
            return self._resume_prompt(request, row)
        # The groups share one pool: resume only if every group's allocation fits,
        # as a scheduler would (the request stays waiting otherwise).
        need = sum(-(-self.slots(request) // lay.tokens_per_block) for lay in self.layouts)
        if need > self.ref_pool.num_free:
            self.event(events.POOL_EXHAUSTED)
            return
        blocks = []
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            r, i = self._both(f"group {g} resume", lambda: ref.resume(request), lambda: impl.resume(request))
            if r != i:
                raise Discrepancy(f"group {g} resume", f"blocks: expected {r}, got {i}")
            blocks.append(r)
        req.preempted = False
        self._place(request, row, blocks)  # replaced with add_row, never appended to
        self.event(events.RESUMED)

    def _move(self, src: int, dst: int) -> None:
        if dst != src and self.rows[dst] is not None:
            raise ValueError(f"move: destination row {dst} holds request {self.rows[dst]}")
        self.ref_tables.move_row(src, dst)
        self.tables.move_row(src, dst)
        if src == dst:
            self.event(events.SELF_MOVE)
            return
        self.rows[dst], self.rows[src] = self.rows[src], None
        if self.rows[dst] is not None:
            self.requests[self.rows[dst]].row = dst

    def _swap(self, a: int, b: int) -> None:
        self.ref_tables.swap_row(a, b)
        self.tables.swap_row(a, b)
        if a == b:
            self.event(events.SELF_SWAP)
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
        """A bad call on both sides (properties/rejections.py): both must refuse it with
        the same error type and change nothing (the comparisons after the step see
        any change)."""
        if kind not in REJECTIONS:
            raise ValueError(f"unknown rejection {kind!r}")
        calls = REJECTIONS[kind].calls(self, which % len(self.layouts), which)
        if calls is None:
            return
        try:
            self._both(f"rejection {kind}", *calls)
        except ValueError:
            self.event(events.rejected(kind))
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
            self.event(events.CUDA_GRAPH_PADDING)
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
            positions_parts.append(np.arange(start, stop, dtype=np.int64))
            if self.prompts is not None:  # each value a hash of its whole prefix
                value_parts.append(self.prompts.values(req.id, start, stop))
                continue
            again = self.history[req.id][start:stop]  # recompute: the same tokens, the same values
            fresh = chunk - len(again)
            value_parts += [np.array(again, dtype=np.int64),
                            np.arange(self.next_value, self.next_value + fresh, dtype=np.int64)]
            self.next_value += fresh
        positions_np, values = np.concatenate(positions_parts), np.concatenate(value_parts)
        if any(c > TILE or (s // TILE != (s + c - 1) // TILE) for s, c in zip(qsl[:-1], chunks) if c):
            self.event(events.TILE_CROSSING)
        if self.world.id_offset:
            self.event(events.IDS_NEAR_INT32_MAX)

        # Everything is launched first and comes back in one copy (properties/device_step.py).
        written = {self.rows[r]: self.requests[self.rows[r]].written + chunk for r, chunk in enumerate(chunks) if chunk}
        back, reads = device_step.launch_and_check(self, qsl, positions_np, values, N, written, padded)
        for r, chunk in enumerate(chunks):
            if chunk:
                req = self.requests[self.rows[r]]
                self.history.write(req.id, req.written, values[int(qsl[r]):int(qsl[r]) + chunk])
                req.written += chunk
        self._device_rows = back.tables  # for the comparisons after the step
        device_step.check_padded(padded, back.padded)
        device_step.compare_reads(self, reads, back.reads)
        if self.kv is not None:
            self.kv.compare(back.kv)
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
            self.event(events.POOL_EXHAUSTED)
            return 0
        tokens = self.prompts.upto(rid, have + q)[have:] if self.prompts is not None else None
        if tokens is not None and any(self.ref_pool.is_cached(b) for b in self.ref_pool.free_queue[:sum(a for a, _ in need)]):
            self.event(events.EVICTED)  # the blocks this growth takes come from the queue's head
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            r, i = self._both(f"group {g} append", lambda: ref.append(rid, q, tokens),
                              lambda: impl.append(rid, q, tokens))
            if (r.cow, r.new) != (i.cow, i.new):
                raise Discrepancy(f"group {g} append", f"request {rid} growing by {q}: expected copy {r.cow} and "
                                                       f"new blocks {r.new}, got copy {i.cow} and new blocks {i.new}")
            if r.cow is not None:
                self.event(events.COPY_ON_WRITE)
                ids = self.ids(ref.blocks[rid])
                self.ref_tables[g].add_row(ids, row)
                self.tables[g].add_row(ids, row)
            else:
                ids = self.ids(r.new)
                self.ref_tables[g].append_row(ids, row)
                self.tables[g].append_row(ids, row)
            if int(self.ref_tables[g].count[row]) == self.ref_tables[g].width:
                self.event(events.ROW_FILLED)
        return q
