"""The lockstep's state: both sides built from one world, and the harness's own
bookkeeping (which request sits in which row, what each has written). Every room of
the lockstep works on a `State`; the driver (lockstep/driver.py) is one.

The two sides have the same parts under the same names, `reference` and `impl`:
the pool, each group's sequences and the multi-group table. The implementation side
also has its device caches for the data oracle (`caches`) and, in a world with KV
caches, the KV world (lockstep/kv.py). The reference side's history of values is
`history`, and in prefix-caching worlds the harness keeps every request's tokens
(`prompts`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import numpy as np

from blocktable.device import Backend
from blocktable.groups import MultiGroupBlockTable
from blocktable.oracle import DeviceCache
from blocktable.plugin import PluginError, Plugins, world_refusal
from blocktable.pool import BlockPool
from blocktable.properties.classes.pool import DrivenPool
from blocktable.properties.classes.table import DrivenTables
from blocktable.properties.compare import Discrepancy
from blocktable.properties.lockstep import events
from blocktable.properties.lockstep.prompts import Prompts
from blocktable.properties.world import WorldConfig
from blocktable.reference import BlockPool as ReferencePool
from blocktable.reference import History
from blocktable.reference import MultiGroupBlockTable as ReferenceGroups
from blocktable.reference import SequenceBlocks as ReferenceSequences
from blocktable.sequence import SequenceBlocks
from blocktable.table import BlockTable

TILE = 1024  # the kernels' token tile

Pool = TypeVar("Pool")
Sequences = TypeVar("Sequences")
Tables = TypeVar("Tables")


@dataclass
class Side(Generic[Pool, Sequences, Tables]):
    """One side's pool, per-group sequences and multi-group table."""

    pool: Pool
    seqs: list[Sequences]
    tables: Tables


@dataclass
class Request:
    id: int
    row: int | None = None
    written: int = 0  # positions [0, written) hold their values on the device
    depth: int = 0  # fork generations
    preempted: bool = False


class State:
    """Both sides of one world, and the rows and requests between them."""

    def __init__(self, world: WorldConfig, kernels: Plugins, backend: Backend,
                 on_event: Callable[[str], None] | None = None) -> None:
        refusal = world_refusal(kernels, world)
        if refusal is not None:
            raise PluginError(refusal)
        self.world = world
        self.kernels = kernels
        self.backend = backend
        self.on_event = on_event
        self.layouts = world.layouts()
        self.events: Counter[str] = Counter()
        self.steps_checked = 0
        self.steps_with_tokens = 0  # of those, steps that scheduled at least one token

        caching = world.prefix_caching
        ref_pool = ReferencePool(world.num_blocks, world.null_block, prefix_caching=caching,
                                 free_order=world.free_order)
        self.reference: Side[ReferencePool, ReferenceSequences, ReferenceGroups] = Side(
            ref_pool,
            [ReferenceSequences(ref_pool, lay.tokens_per_block, group=g) for g, lay in enumerate(self.layouts)],
            ReferenceGroups(world.max_num_reqs, world.max_model_len, self.layouts))
        self.history = History()
        self.prompts = Prompts(world.vocabulary) if caching else None  # token ids, in prefix-caching worlds only
        pool = self._pool(world, kernels)
        self.impl: Side[BlockPool, SequenceBlocks, MultiGroupBlockTable] = Side(
            pool, [SequenceBlocks(pool, lay.tokens_per_block, group=g) for g, lay in enumerate(self.layouts)],
            self._tables(world, kernels, backend))
        self.caches = [DeviceCache(world.num_blocks * lay.kv_block_size, slot_base=world.id_offset * lay.kv_block_size,
                                   ranks=lay.world, backend=backend) for lay in self.layouts]
        self.kv: Any = None  # the KV world (lockstep/kv.py), set by the driver in worlds with KV caches
        self.v2: Any = None  # the V2 tables (lockstep/v2.py), set by the driver in worlds with them
        # The harness's own bookkeeping (neither side): which request sits in which row.
        self.rows: list[int | None] = [None] * world.max_num_reqs
        self.requests: dict[int, Request] = {}
        self.next_request = 0
        self.next_value = 1
        self.invariants_held: tuple | None = None  # the state docs/contract.md §6's invariants last held in
        self.device_rows: list[np.ndarray] | None = None  # the device tables, read back at the end of a step

    @staticmethod
    def _pool(world: WorldConfig, kernels: Plugins) -> BlockPool:
        """Ours, or the pool class under test (docs/contract.md §11) driven by our
        sequences through its protocol."""
        config = dict(num_blocks=world.num_blocks, null_block=world.null_block, prefix_caching=world.prefix_caching,
                      free_order=world.free_order)
        if kernels.pool is None:
            return BlockPool(**config)  # type: ignore[arg-type]
        name = kernels.class_name("pool")
        return cast(BlockPool, DrivenPool.build(kernels.pool, name, **config))  # type: ignore[arg-type]

    def _tables(self, world: WorldConfig, kernels: Plugins, backend: Backend) -> MultiGroupBlockTable:
        """Ours, or the table class under test (docs/contract.md §11), one object per
        DCP rank, driven through its protocol."""
        if kernels.table is None:
            return MultiGroupBlockTable([
                BlockTable(world.max_num_reqs, world.max_model_len, kv_block_size=g.kv_block_size,
                           kernel_block_size=g.kernel_block_size, sharded=g.sharded,
                           cp_world_size=world.cp_world_size, cp_interleave=g.cp_interleave, backend=backend)
                for g in world.groups])
        name = kernels.class_name("table")
        driven = DrivenTables.build(kernels.table, name, world, backend)
        driven.probe_refusals(self.reference.tables)
        return cast(MultiGroupBlockTable, driven)

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
        return self.reference.seqs[0].num_tokens[rid]

    def place(self, rid: int, row: int, blocks_per_group: list[list[int]]) -> None:
        """Request rid takes `row` with these blocks in each group (add_row on both sides)."""
        before = [int(t.count[row]) for t in self.reference.tables.tables]
        ids = [self.ids(b) for b in blocks_per_group]
        self.reference.tables.add_row(ids, row)
        self.impl.tables.add_row(ids, row)
        if self.v2 is not None:
            self.v2.stage(rid, ids, overwrite=True)
        if any(int(t.count[row]) < b for t, b in zip(self.reference.tables.tables, before)):
            self.event(events.ROW_REUSED_SHORTER)
        self.rows[row] = rid
        self.requests[rid].row = row

    def admit(self, rid: int, row: int, rows: list[list[int]], written: int = 0) -> None:
        """A new request, its first `written` positions computed already (prefix hits)."""
        self.requests[rid] = Request(rid, written=written)
        self.history.add(rid)
        self.place(rid, row, rows)

    def both(self, part: str, reference_call: Callable[[], Any], impl_call: Callable[[], Any],
             group: int | None = None) -> tuple[Any, Any]:
        """Run a call on both sides; they must both succeed or both raise the same type."""
        outcomes: list[tuple[Exception | None, Any]] = []
        for call in (reference_call, impl_call):
            try:
                outcomes.append((None, call()))
            except (ValueError, TypeError) as e:
                outcomes.append((e, None))
        (ref_err, ref_out), (impl_err, impl_out) = outcomes
        if type(ref_err) is not type(impl_err):
            raise Discrepancy(part, f"the reference {'raised ' + repr(ref_err) if ref_err else 'succeeded'}, "
                                    f"the implementation {'raised ' + repr(impl_err) if impl_err else 'succeeded'}",
                              group=group)
        if ref_err is not None:
            raise ref_err
        return ref_out, impl_out
