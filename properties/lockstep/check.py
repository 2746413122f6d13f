"""The comparisons after every lockstep step (docs/contract.md §3, §6, §8): every
group's table (host rows, counts, committed device rows, whole buffers), the pool's
ref counts, free queue in order and free count, every sequence's blocks and lengths, in
prefix-caching worlds the cache map and every sequence's tokens, and the
invariants on the reference whenever the state they depend on changed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from blocktable.device import to_host
from blocktable.properties.classes.table import DrivenTables
from blocktable.properties.compare import Discrepancy, assert_arrays_equal
from blocktable.properties.lockstep import events
from blocktable.properties.lockstep.state import State


@dataclass(frozen=True)
class TableRows:
    """A table part's first differing row (`source`: "host" or "device") as each side
    holds it, and its counts: a Discrepancy's detail."""

    source: str
    row: int
    rows: tuple[np.ndarray, np.ndarray]  # (the reference's, ours)
    counts: tuple[int, int]


def check_table(g: int, reference: Any, impl: Any, device_rows: np.ndarray | None = None,
                note: str | None = None) -> None:
    """One group's table: host rows, counts and the committed device copy (read here
    unless given). `note`: where the caller was, added to the report."""
    if device_rows is None:
        device_rows = impl.device_rows()

    def rows_of(source: str, expected: np.ndarray, actual: np.ndarray) -> Callable[[tuple[int, ...]], TableRows]:
        return lambda index: TableRows(source, index[0], (expected[index[0]].copy(), actual[index[0]].copy()),
                                       (int(reference.count[index[0]]), int(impl.count[index[0]])))

    try:
        assert_arrays_equal("table host rows", reference.host, impl.host, group=g,
                            detail=rows_of("host", reference.host, impl.host))
        assert_arrays_equal("table row counts", reference.count, impl.count, group=g)
        assert_arrays_equal("table device rows", reference.device, device_rows, group=g,
                            detail=rows_of("device", reference.device, device_rows))
    except Discrepancy as error:
        if note:
            error.notes.append(note)
        raise


def check_pool(reference: Any, impl: Any, note: str | None = None) -> None:
    """Ref counts, the free queue in order, and the free count (which a pool may keep
    apart from its queue, and which decides every later allocation). `note`: where
    the caller was."""
    try:
        assert_arrays_equal("pool ref counts", np.asarray(reference.ref, dtype=np.int32), impl.ref)
        ref_queue, impl_queue = reference.free_queue(), impl.free_queue()
        if ref_queue != impl_queue:
            first = next((i for i, (a, b) in enumerate(zip(ref_queue, impl_queue)) if a != b),
                         min(len(ref_queue), len(impl_queue)))
            raise Discrepancy("pool free queue", f"differs from position {first}: expected "
                              f"{ref_queue[first:first + 8]}, got {impl_queue[first:first + 8]} "
                              f"(lengths {len(ref_queue)} and {len(impl_queue)})")
        if reference.num_free != impl.num_free:
            raise Discrepancy("pool free count", f"expected {reference.num_free} free blocks, the pool counts "
                                                 f"{impl.num_free} (its queue holds {len(impl_queue)})")
    except Discrepancy as error:
        if note:
            error.notes.append(note)
        raise


def check_prefix_cache(state: State) -> list[tuple[int, int, list[int]]]:
    """docs/contract.md §8 after every step: the cache map as (group, prefix length,
    blocks) per key in insertion order, and every sequence's tokens, on both sides."""
    reference, impl = state.reference, state.impl
    listing, got = reference.pool.cache_listing(), impl.pool.cache_listing()
    if listing != got:
        i = next((i for i, (a, b) in enumerate(zip(listing, got)) if a != b), min(len(listing), len(got)))
        raise Discrepancy("prefix cache map", f"{len(listing)} keys expected, {len(got)} held; key {i}: expected "
                                              f"{listing[i] if i < len(listing) else 'none'}, got "
                                              f"{got[i] if i < len(got) else 'none'} (group, tokens, blocks)")
    for g, (ref, ours) in enumerate(zip(reference.seqs, impl.seqs)):
        if ref.tokens != ours.tokens:
            raise Discrepancy("sequence tokens", f"expected {ref.tokens}, got {ours.tokens}", group=g)
    if any(len(blocks) > 1 for _, _, blocks in listing):
        state.event(events.KEY_TWO_BLOCKS)
    return listing


def check(state: State) -> None:
    """Everything after a step. A step reads the device tables back with its data,
    after its last launch (`state.device_rows`); otherwise they are read here."""
    device_rows, state.device_rows = state.device_rows, None
    reference, impl = state.reference, state.impl
    if device_rows is None:
        device_rows = to_host([impl.tables[g].device_tensor for g in range(len(state.layouts))])
    for g, rows in enumerate(device_rows):
        check_table(g, reference.tables[g], impl.tables[g], rows)
    if isinstance(impl.tables, DrivenTables):  # a table class: its other ranks' objects too
        for R, views in enumerate(impl.tables.ranks[1:], 1):
            for g, view in enumerate(views):
                check_table(g, reference.tables[g], view, note=f"in the table object built for cp_rank {R}")
    check_pool(reference.pool, impl.pool)
    if state.v2 is not None:
        state.v2.check_host()
    for g, (ref, ours) in enumerate(zip(reference.seqs, impl.seqs)):
        if ref.blocks != ours.blocks:
            raise Discrepancy("sequence blocks", f"expected {ref.blocks}, got {ours.blocks}", group=g)
        if ref.num_tokens != ours.num_tokens:
            raise Discrepancy("sequence lengths", f"expected {ref.num_tokens}, got {ours.num_tokens}", group=g)
    listing = check_prefix_cache(state) if state.prompts is not None else None
    # The invariants (docs/contract.md §6, §8) are a function of the ref counts, the
    # free queue, the live tables and the cache map alone: checked again whenever
    # any of them changed (a swap, a move or a refused call changes none of them,
    # and neither does a decode step inside a block).
    pool = reference.pool
    held = (pool.ref.tobytes(), pool.queue, [s.blocks for s in reference.seqs], listing)
    if held != state.invariants_held:  # compared in place; copied only when it changed
        pool.check_invariants([table for s in reference.seqs for table in s.live_tables()])
        if listing is not None:
            for s in reference.seqs:
                s.check_cache_keys()
        state.invariants_held = (held[0], list(held[1]),
                                 [{rid: list(blocks) for rid, blocks in s.blocks.items()} for s in reference.seqs],
                                 listing)
