"""The lockstep's prefix-caching operations (docs/contract.md §8), mixed into Lockstep:
a request added with a prompt is looked up on both sides, a preempted one is looked
up again on resume, the cache can be reset, and after every step the cache map and
every sequence's tokens are compared. Worlds without prefix caching never get here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from blocktable import prefix as implementation_prefix
from blocktable.properties import events
from blocktable.properties.compare import Discrepancy
from blocktable.properties.prompts import lookup_events
from blocktable.reference import prefix as reference_prefix

if TYPE_CHECKING:
    from blocktable.properties.lockstep import Lockstep


class PrefixCachingOps:
    def _add_prompt(self: Lockstep, row: int, prompt: list[int]) -> int:
        """docs/contract.md §8: look the prompt up, touch the hits (no fresh block yet: the
        steps allocate as they compute). Hit tokens are computed: the first step
        schedules position L, and the data read back covers [0, L) at once."""
        if not 1 <= len(prompt) <= self.world.max_model_len:
            raise ValueError(f"add: a prompt of {len(prompt)} tokens, not 1 .. {self.world.max_model_len}")
        for label in lookup_events(self.ref_seqs, prompt):
            self.event(label)
        rid = self.next_request
        self.next_request += 1
        (L, rows), got = self._both("add (prefix lookup)",
                                    lambda: reference_prefix.add_request(self.ref_seqs, rid, prompt, num_new=0),
                                    lambda: implementation_prefix.add_request(self.seqs, rid, prompt, num_new=0))
        if (L, rows) != got:
            raise Discrepancy("prefix lookup", f"request {rid} of {len(prompt)} tokens: expected L={L} and rows "
                                               f"{rows}, got L={got[0]} and rows {got[1]}")
        self.prompts.add(rid, prompt)
        self._admit(rid, row, rows, written=L)
        self.history.write(rid, 0, self.prompts.values(rid, 0, L))
        return rid

    def _resume_prompt(self: Lockstep, request: int, row: int) -> None:
        """With prefix caching a resumed request is looked up again, as vLLM does (its
        own blocks, freed last block first, are often still cached); the steps then
        recompute the rest of its tokens."""
        tokens = self.ref_seqs[0].tokens[request]
        for label in lookup_events(self.ref_seqs, tokens):
            self.event(label)
        (L, rows), got = self._both("resume (prefix lookup)",
                                    lambda: reference_prefix.resume_request(self.ref_seqs, request, num_new=0),
                                    lambda: implementation_prefix.resume_request(self.seqs, request, num_new=0))
        if (L, rows) != got:
            raise Discrepancy("prefix lookup", f"resuming request {request}: expected L={L} and rows {rows}, "
                                               f"got L={got[0]} and rows {got[1]}")
        req = self.requests[request]
        req.preempted, req.written = False, L
        self._place(request, row, rows)
        self.event(events.RESUMED)

    def _reset(self: Lockstep) -> None:
        """docs/contract.md §8's reset_prefix_cache: done only when no block is in use."""
        done, got = self._both("reset_prefix_cache", self.ref_pool.reset_prefix_cache, self.pool.reset_prefix_cache)
        if done != got:
            raise Discrepancy("reset_prefix_cache", f"expected {done}, got {got}")
        self.event(events.RESET_DONE if done else events.RESET_REFUSED)
        self.prompts.seen_at_reset = len(self.prompts.seen)

    def _check_prefix_cache(self: Lockstep) -> list[tuple[int, int, list[int]]]:
        """docs/contract.md §8 after every step: the cache map as (group, prefix length,
        blocks) per key in insertion order, and every sequence's tokens, on both sides."""
        listing, got = self.ref_pool.cache_listing(), self.pool.cache_listing()
        if listing != got:
            i = next((i for i, (a, b) in enumerate(zip(listing, got)) if a != b), min(len(listing), len(got)))
            raise Discrepancy("prefix cache map", f"{len(listing)} keys expected, {len(got)} held; key {i}: expected "
                                                  f"{listing[i] if i < len(listing) else 'none'}, got "
                                                  f"{got[i] if i < len(got) else 'none'} (group, tokens, blocks)")
        for g, (ref, impl) in enumerate(zip(self.ref_seqs, self.seqs)):
            if ref.tokens != impl.tokens:
                raise Discrepancy(f"group {g} sequence tokens", f"expected {ref.tokens}, got {impl.tokens}")
        if any(len(blocks) > 1 for _, _, blocks in listing):
            self.event(events.KEY_TWO_BLOCKS)
        return listing
