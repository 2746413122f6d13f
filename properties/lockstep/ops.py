"""The lockstep's operations on requests and rows (docs/contract.md §3, §6): add,
fork (beam search), finish, preempt and resume (recompute), move, swap and condense
rows, and refused calls. Each runs on both sides and checks what they return; the
comparisons after the step (lockstep/check.py) see everything else. The scheduling
step is lockstep/step.py; prefix caching's add and resume, lockstep/prefix.py."""

from __future__ import annotations

from functools import partial

from blocktable.properties.compare import Discrepancy
from blocktable.properties.lockstep import events, prefix
from blocktable.properties.lockstep.rejections import REJECTIONS
from blocktable.properties.lockstep.state import Request, State


def add(state: State, prompt: list[int] | None = None) -> int:
    row = state.free_row()
    if row is None:
        raise ValueError("add: every row is taken")
    if (prompt is not None) != (state.prompts is not None):
        raise ValueError("add: a request has a prompt exactly when the world caches prefixes")
    if prompt is not None:
        return prefix.add_prompt(state, row, list(prompt))
    rid = state.next_request
    state.next_request += 1
    for g, (ref, impl) in enumerate(zip(state.reference.seqs, state.impl.seqs)):
        state.both("add", partial(ref.add, rid, 0), partial(impl.add, rid, 0), group=g)
    state.admit(rid, row, [[] for _ in state.layouts])
    return rid


def fork(state: State, parent: int) -> int:
    row = state.free_row()
    req = state.requests[parent]
    if row is None or req.row is None or req.written != state.slots(parent):
        raise ValueError(f"fork: request {parent} must be running and fully written, and a row free")
    child = state.next_request
    state.next_request += 1
    blocks = []
    for g, (ref, impl) in enumerate(zip(state.reference.seqs, state.impl.seqs)):
        r, i = state.both("fork", partial(ref.fork, parent, child), partial(impl.fork, parent, child), group=g)
        if r != i:
            raise Discrepancy("fork", f"child blocks: expected {r}, got {i}", group=g)
        blocks.append(r)
    state.requests[child] = Request(child, written=req.written, depth=req.depth + 1)
    state.history.fork(parent, child)
    if state.prompts is not None:
        state.prompts.fork(parent, child)
    state.place(child, row, blocks)
    if req.depth + 1 >= 2:
        state.event(events.FORK_DEPTH_2)
    if state.reference.pool.ref.max() >= 3:  # only a fork raises a ref
        state.event(events.REF_3)
    return child


def note_free_order(state: State, request: int) -> None:
    """The coverage labels of freeing `request` in a world with the vLLM free order: the
    blocks it alone holds reach ref 0, the uncached ones at the head."""
    pool = state.reference.pool
    if pool.free_order != "vllm":
        return
    last = [b for s in state.reference.seqs for b in set(s.blocks.get(request, [])) if pool.ref[b] == 1]
    cached = sum(pool.is_cached(b) for b in last)
    if len(last) - cached >= 2:
        state.event(events.FREED_TO_HEAD)
    if cached and len(last) > cached:
        state.event(events.FREED_SPLIT)


def finish(state: State, request: int, clear: bool = False) -> None:
    note_free_order(state, request)
    req = state.requests.pop(request)
    for g, (ref, impl) in enumerate(zip(state.reference.seqs, state.impl.seqs)):
        state.both("free", partial(ref.free, request), partial(impl.free, request), group=g)
    state.history.drop(request)
    if state.prompts is not None:
        state.prompts.drop(request)
    if state.v2 is not None:
        state.v2.release(request)
    if req.row is not None:
        if clear:
            state.reference.tables.clear_row(req.row)
            state.impl.tables.clear_row(req.row)
        else:
            state.event(events.STALE_ROW)
        state.rows[req.row] = None


def preempt(state: State, request: int) -> None:
    req = state.requests[request]
    if req.row is None:
        raise ValueError(f"preempt: request {request} is not running")
    note_free_order(state, request)
    for g, (ref, impl) in enumerate(zip(state.reference.seqs, state.impl.seqs)):
        state.both("preempt", partial(ref.preempt, request), partial(impl.preempt, request), group=g)
    state.rows[req.row] = None
    req.row, req.written, req.preempted = None, 0, True
    if state.v2 is not None:
        state.v2.release(request)


def resume(state: State, request: int) -> None:
    row = state.free_row()
    req = state.requests[request]
    if row is None or not req.preempted:
        raise ValueError(f"resume: request {request} must be preempted, and a row free")
    if state.prompts is not None:
        return prefix.resume_prompt(state, request, row)
    # The groups share one pool: resume only if every group's allocation fits,
    # as a scheduler would (the request stays waiting otherwise).
    need = sum(-(-state.slots(request) // lay.tokens_per_block) for lay in state.layouts)
    if need > state.reference.pool.num_free:
        state.event(events.POOL_EXHAUSTED)
        return None
    blocks = []
    for g, (ref, impl) in enumerate(zip(state.reference.seqs, state.impl.seqs)):
        r, i = state.both("resume", partial(ref.resume, request), partial(impl.resume, request), group=g)
        if r != i:
            raise Discrepancy("resume", f"blocks: expected {r}, got {i}", group=g)
        blocks.append(r)
    req.preempted = False
    state.place(request, row, blocks)  # replaced with add_row, never appended to
    state.event(events.RESUMED)
    return None


def move(state: State, src: int, dst: int) -> None:
    if dst != src and state.rows[dst] is not None:
        raise ValueError(f"move: destination row {dst} holds request {state.rows[dst]}")
    state.reference.tables.move_row(src, dst)
    state.impl.tables.move_row(src, dst)
    if src == dst:
        state.event(events.SELF_MOVE)
        return
    state.rows[dst], state.rows[src] = state.rows[src], None
    moved = state.rows[dst]
    if moved is not None:
        state.requests[moved].row = dst


def swap(state: State, a: int, b: int) -> None:
    state.reference.tables.swap_row(a, b)
    state.impl.tables.swap_row(a, b)
    if a == b:
        state.event(events.SELF_SWAP)
    state.rows[a], state.rows[b] = state.rows[b], state.rows[a]
    for r in (a, b):
        rid = state.rows[r]
        if rid is not None:
            state.requests[rid].row = r


def condense(state: State) -> None:
    """vLLM's condense: move the last occupied rows into the first holes."""
    while True:
        holes = [r for r, rid in enumerate(state.rows) if rid is None]
        occupied = [r for r, rid in enumerate(state.rows) if rid is not None]
        if not holes or not occupied or holes[0] > occupied[-1]:
            return
        move(state, occupied[-1], holes[0])


def reject(state: State, kind: str, which: int = 0) -> None:
    """A bad call on both sides (lockstep/rejections.py): both must refuse it with the
    same error type and change nothing (the comparisons after the step see any
    change)."""
    if kind not in REJECTIONS:
        raise ValueError(f"unknown rejection {kind!r}")
    calls = REJECTIONS[kind].calls(state, which % len(state.layouts), which)
    if calls is None:
        return
    try:
        state.both(f"rejection {kind}", *calls)
    except ValueError:
        state.event(events.rejected(kind))
        return
    raise Discrepancy(f"rejection {kind}", "both sides accepted a call that must be refused")
