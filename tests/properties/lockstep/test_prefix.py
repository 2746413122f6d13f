"""docs/contract.md §8 through the lockstep: the contract's worked example as a program,
hits checked at the data level, the prompts' values depending on the prefix alone,
admission with fresh blocks, the free count, and token ids spread over 31 bits."""

import dataclasses

import numpy as np
import pytest

from blocktable.properties.compare import Discrepancy
from blocktable.properties.lockstep import events
from blocktable.properties.lockstep.driver import Lockstep
from blocktable.properties.lockstep.prompts import Prompts, noise, prompt_from
from blocktable.properties.world import GroupConfig, WorldConfig


def example_world() -> WorldConfig:
    # §8's example: one replicated group, K = 4 (B = 4), 7 blocks with the null block.
    return WorldConfig(groups=(GroupConfig(4, 4),), num_blocks=7, null_block=True, max_num_reqs=3,
                       max_model_len=16, max_num_batched_tokens=16, prefix_caching=True)


def test_the_contract_example_as_a_program(backend, kernels):
    """Request A = tokens 0..9 gets blocks 1, 2, 3 (1 and 2 full, cached); A finishes:
    the queue is 4, 5, 6, 3, 2, 1. B = 0..7, 99, 98: L = 8, it touches 1 and 2 (queue
    4, 5, 6, 3) and its step allocates 4: row 1, 2, 4, positions 8 and 9 scheduled. C
    needs three fresh blocks: 5, 6, 3; the queue is empty, and blocks 1 and 2, held by
    B, were not evicted. Both sides are compared after every step; the asserts pin the
    reference's state by hand."""
    run = Lockstep(example_world(), kernels("reference"), backend)
    a = run.apply({"op": "add", "prompt": list(range(10))})
    run.apply({"op": "step", "query": [10]})
    assert run.reference.seqs[0].blocks[a] == [1, 2, 3]
    assert run.reference.pool.cache_listing() == [(0, 4, [1]), (0, 8, [2])]
    run.apply({"op": "finish", "request": a})
    assert run.reference.pool.free_queue() == [4, 5, 6, 3, 2, 1]
    b = run.apply({"op": "add", "prompt": list(range(8)) + [99, 98]})
    assert run.requests[b].written == 8  # L = 8: positions 0..7 are computed already
    assert run.reference.pool.free_queue() == [4, 5, 6, 3]
    run.apply({"op": "step", "query": [2]})  # B (row 0 again) computes positions 8 and 9
    assert run.reference.seqs[0].blocks[b] == [1, 2, 4]
    assert run.requests[b].written == 10
    c = run.apply({"op": "add", "prompt": [7] * 12})
    row_c = run.requests[c].row
    query = [0] * 3
    query[row_c] = 12
    run.apply({"op": "step", "query": query})
    assert run.reference.seqs[0].blocks[c] == [5, 6, 3]
    assert run.reference.pool.free_queue() == []
    assert [int(run.reference.pool.ref[x]) for x in (1, 2)] == [1, 1]


def test_a_hit_on_a_block_holding_other_values_is_found(backend, kernels):
    """The data level: B hits A's cached blocks; a value changed in one of them behind
    the harness's back shows in B's read-back of its hit positions."""
    run = Lockstep(example_world(), kernels("reference"), backend)
    a = run.apply({"op": "add", "prompt": list(range(10))})
    run.apply({"op": "step", "query": [10]})
    run.apply({"op": "finish", "request": a})
    cache = run.caches[0].data
    slot = 2 * 4 + 1  # block 2, offset 1: position 5 of the shared prefix
    cache[0, slot] = cache[0, slot] + 1
    run.apply({"op": "add", "prompt": list(range(8)) + [3]})  # L = 8: hits blocks 1 and 2
    with pytest.raises(Discrepancy, match="data read-back: request 1 position 5"):
        run.apply({"op": "step", "query": [0, 0, 0]})  # schedules nothing; reads every live sequence back


def test_values_depend_on_the_prefix_alone():
    prompts = Prompts()
    prompts.add(0, [1, 2, 3])
    prompts.add(1, [1, 2, 3, 0])
    prompts.add(2, [0, 2, 3])
    assert prompts.values(0, 0, 3).tolist() == prompts.values(1, 0, 3).tolist()
    assert prompts.values(0, 1, 3).tolist() != prompts.values(2, 1, 3).tolist()  # same tokens, other prefix
    # Generated tokens follow from the prefix: two requests that agree go on alike.
    prompts.add(3, [1, 2, 3])
    assert prompts.upto(0, 20) == prompts.upto(3, 20)
    assert (prompts.values(0, 0, 20) > 0).all()  # never the oracle's (negative) sentinels


def test_prompts_branch_from_earlier_tokens():
    seen = [[0, 1, 2, 3, 0, 1, 2, 3, 1]]
    assert prompt_from(seen, 0, 1, [3], max_len=100) == [0, 1, 2, 3, 0, 1, 2, 3, 3]
    assert prompt_from(seen, 0, 1, [], max_len=100, block=4) == [0, 1, 2, 3, 0, 1, 2, 3]
    assert prompt_from(seen, 1, 0, [2, 2], max_len=100) == [2, 2]  # one past the sources: fresh
    assert prompt_from(seen, 1, 0, [], max_len=100) == [1]  # never empty
    assert prompt_from(seen, 0, 0, [], max_len=4) == [0, 1, 2, 3]
    assert noise(7, 5) == noise(7, 5) and noise(7, 5)[:3] == noise(7, 3)


def test_fresh_admission_gives_the_hits_and_the_fresh_blocks_in_one_call(backend, kernels):
    """The contract example again, in a world that admits as a scheduler does: each add
    touches its hits, allocates the fresh blocks of the tokens one step computes in the
    same call, and that step follows in the same operation."""
    world = dataclasses.replace(example_world(), fresh_admission=True)
    run = Lockstep(world, kernels("reference"), backend)
    a = run.apply({"op": "add", "prompt": list(range(10))})
    assert run.reference.seqs[0].blocks[a] == [1, 2, 3] and run.requests[a].written == 10
    run.apply({"op": "finish", "request": a})
    b = run.apply({"op": "add", "prompt": list(range(8)) + [99, 98]})
    assert run.reference.seqs[0].blocks[b] == [1, 2, 4] and run.requests[b].written == 10
    assert run.events[events.FRESH_HIT_QUEUED] == 1 and not run.events[events.FRESH_HIT_IN_USE]
    c = run.apply({"op": "add", "prompt": [7] * 12})
    assert run.reference.seqs[0].blocks[c] == [5, 6, 3] and run.reference.pool.free_queue() == []


def test_an_admission_that_fits_only_because_its_hits_are_in_use(backend, kernels):
    """vLLM #11310's place: A holds blocks 1 and 2 (cached) and 3; one block is free.
    B shares A's first 8 tokens: it touches 1 and 2 (in use: nothing leaves the queue)
    and needs one fresh block. Counting the hits too would refuse it."""
    world = WorldConfig(groups=(GroupConfig(4, 4),), num_blocks=5, null_block=True, max_num_reqs=2,
                        max_model_len=16, max_num_batched_tokens=16, prefix_caching=True, fresh_admission=True)
    run = Lockstep(world, kernels("reference"), backend)
    run.apply({"op": "add", "prompt": list(range(9))})
    assert run.reference.pool.num_free == 1
    b = run.apply({"op": "add", "prompt": list(range(8)) + [50]})
    assert run.reference.seqs[0].blocks[b] == [1, 2, 4]
    assert run.events[events.FRESH_FITS_BY_IN_USE] == 1 and run.events[events.FRESH_HIT_IN_USE] == 1


def test_an_admission_short_of_blocks_computes_a_shorter_chunk(backend, kernels):
    world = WorldConfig(groups=(GroupConfig(4, 4),), num_blocks=3, null_block=True, max_num_reqs=2,
                        max_model_len=16, max_num_batched_tokens=16, prefix_caching=True, fresh_admission=True)
    run = Lockstep(world, kernels("reference"), backend)
    a = run.apply({"op": "add", "prompt": list(range(12))})  # 3 blocks' worth, 2 in the pool
    assert run.requests[a].written == 8 and run.reference.pool.num_free == 0
    b = run.apply({"op": "add", "prompt": [5, 5]})  # nothing fits: admitted with its hits (none)
    assert run.requests[b].written == 0 and run.events[events.FRESH_HITS_ONLY] == 1


def test_a_free_count_off_by_one_is_found_where_it_happens(backend, kernels):
    """A touch that takes a block out of the queue without counting it: the queue and
    the ref counts agree, the free count does not, and the check after that add says so."""
    run = Lockstep(example_world(), kernels("reference"), backend)
    a = run.apply({"op": "add", "prompt": list(range(10))})
    run.apply({"op": "step", "query": [10]})
    run.apply({"op": "finish", "request": a})
    pool = run.impl.pool

    def unlink_uncounted(b: int) -> None:
        before, after = pool._prev[b], pool._next[b]
        pool._next[before], pool._prev[after] = after, before

    pool._unlink = unlink_uncounted  # type: ignore[method-assign]
    with pytest.raises(Discrepancy, match=r"pool free count: expected 4 free blocks, the pool counts 6 "
                                          r"\(its queue holds 4\)"):
        run.apply({"op": "add", "prompt": list(range(8)) + [99, 98]})  # touches queued blocks 1 and 2


VOCABULARY = (5, 5 ^ 1 << 20, 5 ^ 1 << 3, 5 ^ 1 << 20 ^ 1 << 3)  # symbols 0 and 1 differ in bit 20 only


def test_the_sides_see_token_ids_and_a_key_of_their_low_16_bits_is_found(backend, kernels, monkeypatch):
    world = dataclasses.replace(example_world(), vocabulary=VOCABULARY)
    run = Lockstep(world, kernels("reference"), backend)
    a = run.apply({"op": "add", "prompt": [0, 0, 0, 0, 1]})
    run.apply({"op": "step", "query": [5]})
    assert run.impl.seqs[0].tokens[a][:5] == [5, 5, 5, 5, 5 ^ 1 << 20]
    assert run.prompts.tokens[a][:5] == [0, 0, 0, 0, 1]  # the harness keeps symbols
    run.apply({"op": "add", "prompt": [1, 1, 1, 1, 0]})  # no block of it is cached: no hit

    from blocktable import keys, prefix

    block_hash = keys.block_hash

    def low_16_bits(parent: bytes, salt: bytes, block: bytes) -> bytes:
        return block_hash(parent, salt, (np.frombuffer(block, dtype=np.int64) & 0xFFFF).tobytes())

    for module in (keys, prefix):
        monkeypatch.setattr(module, "block_hash", low_16_bits)
    run = Lockstep(world, kernels("reference"), backend)
    run.apply({"op": "add", "prompt": [0, 0, 0, 0, 1]})
    run.apply({"op": "step", "query": [5]})
    with pytest.raises(Discrepancy, match="prefix lookup: request 1 of 5 tokens: expected L=0"):
        run.apply({"op": "add", "prompt": [1, 1, 1, 1, 0]})


def test_prompts_map_symbols_to_the_worlds_ids():
    prompts = Prompts(VOCABULARY)
    assert prompts.ids([0, 3, 1]) == [5, 5 ^ 1 << 20 ^ 1 << 3, 5 ^ 1 << 20]
    assert Prompts().ids([7, 99]) == [7, 99]  # worlds saved before vocabularies: a symbol is its id
    with pytest.raises(ValueError, match="symbols lie in 0 .. 3"):
        prompts.ids([4])
    with pytest.raises(ValueError, match="maps 4 symbols"):
        Prompts((1, 2))


def test_an_admission_that_evicts_its_own_hits_is_found(backend, kernels, monkeypatch):
    """vLLM #42948's place: A's blocks 1, 2 (cached), 3 and C's 4 (cached), 5 are freed
    in that order, so the queue is 6, 3, 2, 1, 5, 4. B hits 1 and 2 and needs three
    fresh blocks: touched first, the hits leave the queue and B gets 6, 3, 5. Taking
    the fresh blocks' worth off the queue first would evict hit 2."""
    world = WorldConfig(groups=(GroupConfig(4, 4),), num_blocks=7, null_block=True, max_num_reqs=3,
                        max_model_len=32, max_num_batched_tokens=32, prefix_caching=True, fresh_admission=True)

    def program(run: Lockstep) -> int:
        a = run.apply({"op": "add", "prompt": list(range(10))})
        c = run.apply({"op": "add", "prompt": [7, 7, 7, 7, 8]})
        run.apply({"op": "finish", "request": a})
        run.apply({"op": "finish", "request": c})
        assert run.reference.pool.free_queue() == [6, 3, 2, 1, 5, 4]
        return run.apply({"op": "add", "prompt": list(range(8)) + [9] * 12})

    run = Lockstep(world, kernels("reference"), backend)
    b = program(run)
    assert run.reference.seqs[0].blocks[b] == [1, 2, 6, 3, 5]

    from blocktable import prefix

    add_request = prefix.add_request

    def evicting_first(groups, seq, tokens, num_new=None):
        pool = groups[0].pool
        for block in pool.free_queue()[:3]:  # the three fresh blocks' worth, before the touch
            if pool.is_cached(block):
                pool._evict(block)
        return add_request(groups, seq, tokens, num_new)

    monkeypatch.setattr(prefix, "add_request", evicting_first)
    with pytest.raises(Discrepancy, match=r"prefix lookup: request 2 of 20 tokens: expected L=8 and rows "
                                          r"\[\[1, 2, 6, 3, 5\]\], got L=4"):
        program(Lockstep(world, kernels("reference"), backend))
