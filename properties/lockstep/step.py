"""The scheduling step, host side (docs/contract.md §3-§5, §7): which tokens each
running request computes, the blocks they take (copy-on-write after forks), the
rows appended, the commit, the CUDA-graph padding, and the positions and values the
step writes. Everything the step does on the device is then launched and checked by
lockstep/launch.py; the values become the reference's history once it passed."""

from __future__ import annotations

from functools import partial

import numpy as np

from blocktable.properties.compare import Discrepancy
from blocktable.properties.lockstep import events, launch
from blocktable.properties.lockstep.state import TILE, State


def step(state: State, query: list[int], pad: int = 0) -> None:
    occupied = [r for r, rid in enumerate(state.rows) if rid is not None]
    N = occupied[-1] + 1 if occupied else 0
    budget = state.world.max_num_batched_tokens
    chunks: list[int] = []
    for r in range(N):
        rid = state.rows[r]
        q = query[r] if r < len(query) else 0
        chunks.append(0 if rid is None else grow(state, rid, r, min(q, budget)))
        budget -= chunks[-1]

    reference, impl = state.reference, state.impl
    reference.tables.commit(N)
    impl.tables.commit(N)
    N_pad = min(N + pad, state.world.max_num_reqs)
    padded: launch.Padded = []  # (group, expected, the returned device rows): read back with the step's data
    if N_pad > N:
        state.event(events.CUDA_GRAPH_PADDING)
        padded = [(g, reference.tables[g].pad_for_cuda_graph(N, N_pad), impl.tables[g].pad_for_cuda_graph(N, N_pad))
                  for g in range(len(state.layouts))]

    qsl = np.zeros(N + 1, dtype=np.int32)
    qsl[1:] = np.cumsum(chunks, dtype=np.int64)
    positions_parts, value_parts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for r, chunk in enumerate(chunks):
        if not chunk:
            continue
        req = state.requests[state.rows[r]]  # type: ignore[index]
        start, stop = req.written, req.written + chunk
        positions_parts.append(np.arange(start, stop, dtype=np.int64))
        if state.prompts is not None:  # each value a hash of its whole prefix
            value_parts.append(state.prompts.values(req.id, start, stop))
            continue
        again = state.history[req.id][start:stop]  # recompute: the same tokens, the same values
        fresh = chunk - len(again)
        value_parts += [np.array(again, dtype=np.int64),
                        np.arange(state.next_value, state.next_value + fresh, dtype=np.int64)]
        state.next_value += fresh
    positions, values = np.concatenate(positions_parts), np.concatenate(value_parts)
    if any(c > TILE or (s // TILE != (s + c - 1) // TILE) for s, c in zip(qsl[:-1], chunks) if c):
        state.event(events.TILE_CROSSING)
    if state.world.id_offset:
        state.event(events.IDS_NEAR_INT32_MAX)

    # Everything is launched first and comes back in one copy (lockstep/launch.py).
    written = {rid: state.requests[rid].written + chunk for rid, chunk in zip(state.rows, chunks)
               if chunk and rid is not None}
    back, reads = launch.launch_and_check(state, qsl, positions, values, N, written, padded, N_pad)
    for r, chunk in enumerate(chunks):
        if chunk:
            req = state.requests[state.rows[r]]  # type: ignore[index]
            state.history.write(req.id, req.written, values[int(qsl[r]):int(qsl[r]) + chunk])
            req.written += chunk
    state.device_rows = back.tables  # for the comparisons after the step
    launch.check_padded(padded, back.padded)
    launch.compare_reads(state, reads, back.reads)
    if state.kv is not None:
        state.kv.compare(back.kv)
    if state.v2 is not None:
        state.v2.compare(back.v2)
    state.steps_checked += 1
    state.steps_with_tokens += bool(len(positions))


def grow(state: State, rid: int, row: int, q: int) -> int:
    """How many tokens request rid computes this step, allocating (and copying on
    write) for new ones. Recompute after a resume needs no allocation."""
    req = state.requests[rid]
    have = state.slots(rid)
    if req.written < have:
        return min(q, have - req.written)
    q = min(q, state.world.max_model_len - have)
    if q <= 0:
        return 0
    reference, impl = state.reference, state.impl
    need = [(ref.blocks_needed(rid, q), ours.blocks_needed(rid, q)) for ref, ours in zip(reference.seqs, impl.seqs)]
    if any(a != b for a, b in need):
        raise Discrepancy("blocks needed", f"request {rid} growing by {q}: expected {[a for a, _ in need]}, "
                                           f"got {[b for _, b in need]}")
    if sum(a for a, _ in need) > reference.pool.num_free:
        state.event(events.POOL_EXHAUSTED)
        return 0
    tokens = state.prompts.ids(state.prompts.upto(rid, have + q)[have:]) if state.prompts is not None else None
    if tokens is not None and any(reference.pool.is_cached(b)
                                  for b in reference.pool.queue[:sum(a for a, _ in need)]):
        state.event(events.EVICTED)  # the blocks this growth takes come from the queue's head
    gained: list[list[int]] = []  # each group's new table ids
    copied = False
    for g, (ref, ours) in enumerate(zip(reference.seqs, impl.seqs)):
        r, i = state.both("append", partial(ref.append, rid, q, tokens), partial(ours.append, rid, q, tokens),
                          group=g)
        if (r.cow, r.new) != (i.cow, i.new):
            raise Discrepancy("append", f"request {rid} growing by {q}: expected copy {r.cow} and "
                                        f"new blocks {r.new}, got copy {i.cow} and new blocks {i.new}", group=g)
        if r.cow is not None:
            state.event(events.COPY_ON_WRITE)
        gained.append(state.ids(r.new) if r.cow is None else [])
        copied = copied or r.cow is not None
    # One call for every group, as vLLM's runner makes it (V1 and V2 alike): a copy on
    # write in any group replaces every group's row with its whole list.
    if copied:
        whole = [state.ids(seq.blocks[rid]) for seq in reference.seqs]
        reference.tables.add_row(whole, row)
        impl.tables.add_row(whole, row)
        if state.v2 is not None:
            state.v2.stage(rid, whole, overwrite=True)
    elif any(gained):
        reference.tables.append_row(gained, row)
        impl.tables.append_row(gained, row)
        if state.v2 is not None:
            state.v2.stage(rid, gained, overwrite=False)
    if any(int(t.count[row]) == t.width for t in reference.tables.tables):
        state.event(events.ROW_FILLED)
    return q
