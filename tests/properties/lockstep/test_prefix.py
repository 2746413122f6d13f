"""docs/contract.md §8 through the lockstep: the contract's worked example as a program,
hits checked at the data level, and the prompts' values depending on the prefix alone."""

import pytest

from blocktable.properties.compare import Discrepancy
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
