"""The lockstep's prefix-caching operations (docs/contract.md §8): a request added
with a prompt is looked up on both sides, a preempted one is looked up again on
resume, and the cache can be reset. In worlds with fresh admission an add or resume
also gives the tokens one step computes their blocks in the same call, after the
hits are touched, and that step follows, as a scheduler admits a request. Worlds
without prefix caching never get here; the cache map and tokens are compared after every step by lockstep/check.py."""

from __future__ import annotations

from blocktable import prefix as implementation_prefix
from blocktable.properties.compare import Discrepancy
from blocktable.properties.lockstep import events
from blocktable.properties.lockstep.prompts import lookup_events
from blocktable.properties.lockstep.state import State
from blocktable.properties.lockstep.step import step
from blocktable.reference import prefix as reference_prefix
from blocktable.reference.keys import block_key


def fresh_tokens(state: State, tokens: list[int]) -> int:
    """`num_new` for admitting these token ids. In a world with fresh admission, the
    tokens past the hits that one step computes (up to Tmax), or as many of them as
    have blocks, counted as docs/contract.md §8 counts them: the fresh ones and the
    hits at ref 0 (touching takes them from the queue), never the hits in use. 0 in
    other worlds, or when not one fits: the hits alone, and the steps allocate as they
    compute. Labels what the admission reaches."""
    if not state.world.fresh_admission:
        return 0
    seqs, pool = state.reference.seqs, state.reference.pool
    L = reference_prefix.find_prefix(seqs, tokens)

    def fresh_blocks(n: int) -> int:
        return sum(-(-(L + n) // s.tokens_per_block) - L // s.tokens_per_block for s in seqs)

    num_new = min(len(tokens) - L, state.world.max_num_batched_tokens)
    queued = reference_prefix.blocks_to_add(seqs, tokens, num_new) - fresh_blocks(num_new)
    # A scheduler short of blocks admits a shorter first chunk (or the hits alone),
    # which is also where an admission fits only as §8 counts its blocks.
    while num_new and queued + fresh_blocks(num_new) > pool.num_free:
        num_new -= 1
    if not num_new:
        state.event(events.FRESH_HITS_ONLY)
        return 0
    need = reference_prefix.blocks_to_add(seqs, tokens, num_new)
    by_group = [[pool.first_cached(block_key(s.group, tokens, j, s.tokens_per_block))
                 for j in range(L // s.tokens_per_block)] for s in seqs]
    hits = [b for group in by_group for b in group if b is not None]  # find_prefix found every one of them
    in_use = [b for b in hits if pool.ref[b] > 0]
    if in_use:
        state.event(events.FRESH_HIT_IN_USE)
        if need + len(in_use) > pool.num_free:
            state.event(events.FRESH_FITS_BY_IN_USE)
    if len(in_use) < len(hits):
        state.event(events.FRESH_HIT_QUEUED)
    # The fresh blocks come off the queue's head once the hits have left it.
    fresh = need - (len(hits) - len(in_use))
    hit_keys = {pool.block_key(b) for b in hits}
    taken = [b for b in pool.queue if b not in hits][:fresh]
    if any(pool.is_cached(b) and pool.block_key(b) not in hit_keys for b in taken):
        state.event(events.FRESH_EVICTS)
    if len(seqs) > 1 and _group_by_group_evicts(state, by_group, L, num_new):
        state.event(events.FRESH_EVICTS_OTHER_GROUP)
    return num_new


def _group_by_group_evicts(state: State, hits: list[list[int | None]], L: int, num_new: int) -> bool:
    """Whether admitting group by group (each group's `hits` touched, then its fresh
    blocks allocated, before the next group's) would take a later group's queued hit
    off the head: the order §8's admission must not follow (vLLM #11565)."""
    seqs, pool = state.reference.seqs, state.reference.pool
    queue = list(pool.queue)
    for g, s in enumerate(seqs):
        queue = [b for b in queue if b not in hits[g]]
        fresh = -(-(L + num_new) // s.tokens_per_block) - L // s.tokens_per_block
        taken, queue = queue[:fresh], queue[fresh:]
        if any(b in later for later in hits[g + 1:] for b in taken):
            return True
    return False


def compute_admitted(state: State, rid: int, num_new: int) -> None:
    """The step an admission is part of: the tokens it gave slots to are computed at
    once, as the scheduler step that admits a request computes them. The blocks they
    filled are cached as the admission gave them slots (§8), so no other request may
    hit them before their values are written."""
    if num_new:
        query = [0] * state.world.max_num_reqs
        query[state.requests[rid].row] = num_new  # type: ignore[index]
        step(state, query)


def add_prompt(state: State, row: int, prompt: list[int]) -> int:
    """docs/contract.md §8: look the prompt up, touch the hits, then (fresh_tokens)
    give fresh blocks to the tokens one step computes, and compute them, or leave
    them to the steps. Hit tokens are computed: the first step schedules position L,
    and the data read back covers [0, L) at once. `prompt` is in symbols; the sides
    see its token ids."""
    assert state.prompts is not None
    if not 1 <= len(prompt) <= state.world.max_model_len:
        raise ValueError(f"add: a prompt of {len(prompt)} tokens, not 1 .. {state.world.max_model_len}")
    tokens = state.prompts.ids(prompt)
    for label in lookup_events(state.reference.seqs, tokens):
        state.event(label)
    num_new = fresh_tokens(state, tokens)
    rid = state.next_request
    state.next_request += 1
    (L, rows), got = state.both(
        "add (prefix lookup)",
        lambda: reference_prefix.add_request(state.reference.seqs, rid, tokens, num_new=num_new),
        lambda: implementation_prefix.add_request(state.impl.seqs, rid, tokens, num_new=num_new))
    if (L, rows) != got:
        raise Discrepancy("prefix lookup", f"request {rid} of {len(prompt)} tokens: expected L={L} and rows "
                                           f"{rows}, got L={got[0]} and rows {got[1]}")
    state.prompts.add(rid, prompt)
    state.admit(rid, row, rows, written=L)
    state.history.write(rid, 0, state.prompts.values(rid, 0, L))
    compute_admitted(state, rid, num_new)
    return rid


def resume_prompt(state: State, request: int, row: int) -> None:
    """With prefix caching a resumed request is looked up again, as vLLM does (its
    own blocks, freed last block first, are often still cached); the steps then
    recompute the rest of its tokens (with fresh admission, the first step's worth
    at once)."""
    tokens = state.reference.seqs[0].tokens[request]
    for label in lookup_events(state.reference.seqs, tokens):
        state.event(label)
    num_new = fresh_tokens(state, tokens)
    (L, rows), got = state.both(
        "resume (prefix lookup)",
        lambda: reference_prefix.resume_request(state.reference.seqs, request, num_new=num_new),
        lambda: implementation_prefix.resume_request(state.impl.seqs, request, num_new=num_new))
    if (L, rows) != got:
        raise Discrepancy("prefix lookup", f"resuming request {request}: expected L={L} and rows {rows}, "
                                           f"got L={got[0]} and rows {got[1]}")
    req = state.requests[request]
    req.preempted, req.written = False, L
    state.place(request, row, rows)
    state.event(events.RESUMED)
    compute_admitted(state, request, num_new)


def reset(state: State) -> None:
    """docs/contract.md §8's reset_prefix_cache: done only when no block is in use."""
    if state.prompts is None:
        raise ValueError("reset: this world does not cache prefixes")
    done, got = state.both("reset_prefix_cache", state.reference.pool.reset_prefix_cache,
                           state.impl.pool.reset_prefix_cache)
    if done != got:
        raise Discrepancy("reset_prefix_cache", f"expected {done}, got {got}")
    state.event(events.RESET_DONE if done else events.RESET_REFUSED)
    state.prompts.seen_at_reset = len(state.prompts.seen)
