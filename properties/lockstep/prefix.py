"""The lockstep's prefix-caching operations (docs/contract.md §8): a request added
with a prompt is looked up on both sides, a preempted one is looked up again on
resume, and the cache can be reset. Worlds without prefix caching never get here;
the cache map and tokens are compared after every step by lockstep/check.py."""

from __future__ import annotations

from blocktable import prefix as implementation_prefix
from blocktable.properties.compare import Discrepancy
from blocktable.properties.lockstep import events
from blocktable.properties.lockstep.prompts import lookup_events
from blocktable.properties.lockstep.state import State
from blocktable.reference import prefix as reference_prefix


def add_prompt(state: State, row: int, prompt: list[int]) -> int:
    """docs/contract.md §8: look the prompt up, touch the hits (no fresh block yet: the
    steps allocate as they compute). Hit tokens are computed: the first step
    schedules position L, and the data read back covers [0, L) at once."""
    assert state.prompts is not None
    if not 1 <= len(prompt) <= state.world.max_model_len:
        raise ValueError(f"add: a prompt of {len(prompt)} tokens, not 1 .. {state.world.max_model_len}")
    for label in lookup_events(state.reference.seqs, prompt):
        state.event(label)
    rid = state.next_request
    state.next_request += 1
    (L, rows), got = state.both(
        "add (prefix lookup)",
        lambda: reference_prefix.add_request(state.reference.seqs, rid, prompt, num_new=0),
        lambda: implementation_prefix.add_request(state.impl.seqs, rid, prompt, num_new=0))
    if (L, rows) != got:
        raise Discrepancy("prefix lookup", f"request {rid} of {len(prompt)} tokens: expected L={L} and rows "
                                           f"{rows}, got L={got[0]} and rows {got[1]}")
    state.prompts.add(rid, prompt)
    state.admit(rid, row, rows, written=L)
    state.history.write(rid, 0, state.prompts.values(rid, 0, L))
    return rid


def resume_prompt(state: State, request: int, row: int) -> None:
    """With prefix caching a resumed request is looked up again, as vLLM does (its
    own blocks, freed last block first, are often still cached); the steps then
    recompute the rest of its tokens."""
    tokens = state.reference.seqs[0].tokens[request]
    for label in lookup_events(state.reference.seqs, tokens):
        state.event(label)
    (L, rows), got = state.both(
        "resume (prefix lookup)",
        lambda: reference_prefix.resume_request(state.reference.seqs, request, num_new=0),
        lambda: implementation_prefix.resume_request(state.impl.seqs, request, num_new=0))
    if (L, rows) != got:
        raise Discrepancy("prefix lookup", f"resuming request {request}: expected L={L} and rows {rows}, "
                                           f"got L={got[0]} and rows {got[1]}")
    req = state.requests[request]
    req.preempted, req.written = False, L
    state.place(request, row, rows)
    state.event(events.RESUMED)


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
