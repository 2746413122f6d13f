"""The refused calls: bad calls that both sides must refuse with the same error type,
changing nothing. Each kind builds its pair of calls from a run's state; a kind that
has nothing to aim at in that state (no free block to free twice, say) builds none.

The order of KINDS is part of what a seed means: the lockstep machine draws a kind
from it by index, so a new kind goes at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from blocktable.properties.lockstep import Lockstep

Calls = tuple[Callable[[], Any], Callable[[], Any]]  # (the reference's, the implementation's)


@dataclass(frozen=True)
class Rejection:
    kind: str
    meaning: str
    calls: Callable[["Lockstep", int, int], Calls | None]  # (run, group, which) -> calls


def _row_overflow(run: "Lockstep", g: int, which: int) -> Calls:
    row = which % run.world.max_num_reqs
    ref, impl = run.ref_tables[g], run.tables[g]
    P = run.layouts[g].kernel_blocks_per_block
    n = -(-(ref.width - int(ref.count[row]) + 1) // P)
    ids = run.ids([1 if run.world.null_block else 0] * n)
    return (lambda: ref.append_row(ids, row), lambda: impl.append_row(ids, row))


def _double_free(run: "Lockstep", g: int, which: int) -> Calls | None:
    queue = run.ref_pool.free_queue
    if not queue:
        return None
    b = queue[which % len(queue)]
    return (lambda: run.ref_pool.free([b]), lambda: run.pool.free([b]))


def _free_duplicate(run: "Lockstep", g: int, which: int) -> Calls | None:
    held = [b for s in run.ref_seqs for t in s.live_tables() for b in t]
    if not held:
        return None
    b = held[which % len(held)]
    return (lambda: run.ref_pool.free([b, b]), lambda: run.pool.free([b, b]))


def _over_allocate(run: "Lockstep", g: int, which: int) -> Calls:
    n = run.ref_pool.num_free + 1
    return (lambda: run.ref_pool.allocate(n), lambda: run.pool.allocate(n))


def _fork_unknown(run: "Lockstep", g: int, which: int) -> Calls:
    ghost = run.next_request + 1000
    return (lambda: run.ref_seqs[g].fork(ghost, ghost + 1), lambda: run.seqs[g].fork(ghost, ghost + 1))


REJECTIONS: dict[str, Rejection] = {r.kind: r for r in (
    Rejection("row-overflow", "an append past the row's width", _row_overflow),
    Rejection("double-free", "freeing a block that is already free", _double_free),
    Rejection("free-duplicate", "one block listed twice in one free", _free_duplicate),
    Rejection("over-allocate", "allocating one block more than the pool has free", _over_allocate),
    Rejection("fork-unknown", "forking a request that does not exist", _fork_unknown),
)}
KINDS: tuple[str, ...] = tuple(REJECTIONS)
