"""The refused calls, as data: bad calls that both sides must refuse with the same
error type, changing nothing. Each kind builds its pair of calls from a run's state;
a kind that has nothing to aim at in that state (no free block to free twice, say)
builds none. The kinds and their order are lockstep/schema.py's REJECTION_KINDS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blocktable.properties.lockstep.state import State

Calls = tuple[Callable[[], Any], Callable[[], Any]]  # (the reference's, the implementation's)


@dataclass(frozen=True)
class Rejection:
    kind: str
    meaning: str
    calls: Callable[[State, int, int], Calls | None]  # (state, group, which) -> calls


def _row_overflow(state: State, g: int, which: int) -> Calls:
    row = which % state.world.max_num_reqs
    ref = state.reference.tables[g]
    P = state.layouts[g].kernel_blocks_per_block
    n = -(-(ref.width - int(ref.count[row]) + 1) // P)
    ids = state.ids([1 if state.world.null_block else 0] * n)
    # Group g's row overflows; the other groups are handed nothing (one call for every group, as §11's tables take it).
    every = [ids if h == g else [] for h in range(len(state.layouts))]
    return (lambda: state.reference.tables.append_row(every, row), lambda: state.impl.tables.append_row(every, row))


def _double_free(state: State, g: int, which: int) -> Calls | None:
    queue = state.reference.pool.queue
    if not queue:
        return None
    b = queue[which % len(queue)]
    return (lambda: state.reference.pool.free([b]), lambda: state.impl.pool.free([b]))


def _free_duplicate(state: State, g: int, which: int) -> Calls | None:
    held = [b for s in state.reference.seqs for t in s.live_tables() for b in t]
    if not held:
        return None
    b = held[which % len(held)]
    return (lambda: state.reference.pool.free([b, b]), lambda: state.impl.pool.free([b, b]))


def _over_allocate(state: State, g: int, which: int) -> Calls:
    n = state.reference.pool.num_free + 1
    return (lambda: state.reference.pool.allocate(n), lambda: state.impl.pool.allocate(n))


def _fork_unknown(state: State, g: int, which: int) -> Calls:
    ghost = state.next_request + 1000
    return (lambda: state.reference.seqs[g].fork(ghost, ghost + 1), lambda: state.impl.seqs[g].fork(ghost, ghost + 1))


REJECTIONS: dict[str, Rejection] = {r.kind: r for r in (
    Rejection("row-overflow", "an append past the row's width", _row_overflow),
    Rejection("double-free", "freeing a block that is already free", _double_free),
    Rejection("free-duplicate", "one block listed twice in one free", _free_duplicate),
    Rejection("over-allocate", "allocating one block more than the pool has free", _over_allocate),
    Rejection("fork-unknown", "forking a request that does not exist", _fork_unknown),
)}
