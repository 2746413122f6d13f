"""The comparisons after every lockstep step (docs/contract.md §3, §6, §8): every
group's table (host rows, counts, committed device rows, whole buffers), the pool's
ref counts and free queue in order, every sequence's blocks and lengths, in
prefix-caching worlds the cache map and every sequence's tokens, and the
invariants on the reference whenever the state they depend on changed."""

from __future__ import annotations

from typing import Any

import numpy as np

from blocktable.device import to_host
from blocktable.properties.compare import Discrepancy, assert_arrays_equal
from blocktable.properties.lockstep import events
from blocktable.properties.lockstep.state import State


class TableDiscrepancy(Discrepancy):
    """A table part differs (`source`: "host" or "device"); carries the first differing
    row as each side holds it, and its counts."""

    def __init__(self, error: Discrepancy, source: str, row: int, rows: tuple[np.ndarray, np.ndarray],
                 counts: tuple[int, int]) -> None:
        super().__init__(error.part, error.message, group=error.group, index=error.index, expected=error.expected,
                         actual=error.actual)
        self.source = source
        self.row = row
        self.rows = (rows[0].copy(), rows[1].copy())  # (the reference's, ours)
        self.counts = counts


def check_table(g: int, reference: Any, impl: Any, device_rows: np.ndarray | None = None,
                note: str | None = None) -> None:
    """One group's table: host rows, counts and the committed device copy (read here
    unless given). `note`: where the caller was, added to the report."""
    if device_rows is None:
        device_rows = impl.device_rows()
    for part, source, expected, actual in (("table host rows", "host", reference.host, impl.host),
                                           ("table row counts", None, reference.count, impl.count),
                                           ("table device rows", "device", reference.device, device_rows)):
        try:
            assert_arrays_equal(part, expected, actual, group=g)
        except Discrepancy as error:
            if note:
                error.notes.append(note)
            if source is None or error.index is None:
                raise
            row = error.index[0]
            found = TableDiscrepancy(error, source, row, (expected[row], actual[row]),
                                     (int(reference.count[row]), int(impl.count[row])))
            found.notes = error.notes
            raise found from None


def check_pool(reference: Any, impl: Any, note: str | None = None) -> None:
    """Ref counts and the free queue, in order. `note`: where the caller was."""
    try:
        assert_arrays_equal("pool ref counts", np.asarray(reference.ref, dtype=np.int32), impl.ref)
        ref_queue, impl_queue = reference.free_queue(), impl.free_queue()
        if ref_queue != impl_queue:
            first = next((i for i, (a, b) in enumerate(zip(ref_queue, impl_queue)) if a != b),
                         min(len(ref_queue), len(impl_queue)))
            raise Discrepancy("pool free queue", f"differs from position {first}: expected "
                              f"{ref_queue[first:first + 8]}, got {impl_queue[first:first + 8]} "
                              f"(lengths {len(ref_queue)} and {len(impl_queue)})")
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
    check_pool(reference.pool, impl.pool)
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
