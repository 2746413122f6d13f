"""docs/contract.md §6: fork, copy-on-write, free and preempt/resume on top of the pool.

tokens_per_block is 4 throughout, so block boundaries fall at positions 4, 8, 12...
"""

from blocktable.reference import BlockPool, SequenceBlocks


def seqs(num_blocks=10, null_block=True):
    return SequenceBlocks(BlockPool(num_blocks, null_block=null_block), tokens_per_block=4)


def test_fork_cow_free_sibling_free_parent_returns_the_pool_to_full():
    s = seqs()
    assert s.add(1, 6) == [1, 2]  # 6 tokens: block 2 holds two of four
    s.fork(1, 2)
    assert s.pool.ref[1] == 2 and s.pool.ref[2] == 2 and s.blocks[2] == [1, 2]
    s.check_invariants()
    # The child writes token 6 into shared, partial block 2: copy it first.
    growth = s.append(2, 1)
    assert growth.cow == (2, 3) and growth.new == []
    assert s.blocks[2] == [1, 3] and s.blocks[1] == [1, 2]  # the sibling's table is unchanged
    assert s.pool.ref[1:4].tolist() == [2, 1, 1]
    assert s.take_cow_pairs() == [(2, 3)] and s.take_cow_pairs() == []
    s.check_invariants()
    s.free(2)  # last block first: 3 reaches 0 and is queued; 1 drops to 1
    assert s.pool.free_queue()[-1] == 3 and s.pool.ref[1] == 1
    s.check_invariants()
    s.free(1)  # 2 then 1
    assert s.pool.num_free == 9
    assert s.pool.free_queue() == [4, 5, 6, 7, 8, 9, 3, 2, 1]
    s.check_invariants()


def test_a_full_shared_block_needs_no_copy():
    s = seqs()
    s.add(1, 8)  # blocks 1, 2, both full
    s.fork(1, 2)
    growth = s.append(2, 1)
    assert growth.cow is None and growth.new == [3]
    assert s.blocks[2] == [1, 2, 3] and s.pool.ref[1:4].tolist() == [2, 2, 1]
    s.check_invariants()


def test_copy_on_write_then_overflow_into_new_blocks():
    s = seqs()
    s.add(1, 6)
    s.fork(1, 2)
    assert s.blocks_needed(2, 7) == 3  # the copy, plus cdiv(13, 4) - cdiv(6, 4) = 2
    growth = s.append(2, 7)
    assert growth.cow == (2, 3) and growth.new == [4, 5]
    assert s.blocks[2] == [1, 3, 4, 5] and s.num_tokens[2] == 13
    s.check_invariants()


def test_fork_depth_two_raises_refs_to_three_and_parent_writes_copy_too():
    s = seqs()
    s.add(1, 5)  # [1, 2], block 2 partial
    s.fork(1, 2)
    s.fork(2, 3)
    assert s.pool.ref[1] == 3 and s.pool.ref[2] == 3
    growth = s.append(1, 1)  # the parent also must not write into a shared block
    assert growth.cow == (2, 3)
    assert s.blocks[1] == [1, 3] and s.pool.ref[2] == 2
    s.check_invariants()


def test_fork_counts_a_block_listed_twice_once():
    """docs/contract.md §6: once per block, even if a table lists a block twice (built directly)."""
    s = seqs()
    s.add(1, 12)  # [1, 2, 3]
    s.blocks[1] = [1, 2, 1]  # a table that lists block 1 twice; block 3 given back
    s.pool.free([3])
    s.check_invariants()
    s.fork(1, 2)
    assert s.pool.ref[1] == 2 and s.pool.ref[2] == 2
    s.check_invariants()
    s.free(2)
    s.free(1)
    assert s.pool.num_free == 9
    s.check_invariants()


def test_preempt_frees_everything_and_resume_allocates_afresh():
    s = seqs()
    s.add(1, 10)  # [1, 2, 3]
    s.add(2, 4)  # [4]
    s.preempt(1)
    assert s.pool.free_queue() == [5, 6, 7, 8, 9, 3, 2, 1] and not s.is_live(1)
    s.check_invariants()
    assert s.resume(1) == [5, 6, 7]  # cdiv(10, 4) = 3 fresh blocks from the head
    assert s.num_tokens[1] == 10
    s.check_invariants()
    s.preempt(1)
    s.free(1)  # aborted while preempted: nothing more to give back
    assert 1 not in s.num_tokens
    s.check_invariants()


def test_bad_sequence_calls_are_rejected_and_change_nothing(rejects):
    s = seqs(num_blocks=5)
    s.add(1, 6)  # [1, 2]
    s.fork(1, 2)
    state = (s, s.pool)
    # 6 + 9 = 15 tokens: cdiv(15, 4) - cdiv(6, 4) = 2 new blocks, plus the copy of block 2.
    rejects(state, ValueError, "append: sequence 2 needs 3 blocks, only 2 free", s.append, 2, 9)
    rejects(state, ValueError, "add: sequence 1 already exists", s.add, 1, 3)
    rejects(state, ValueError, "cannot allocate 3 blocks: only 2 are free", s.add, 3, 12)
    rejects(state, ValueError, "fork: sequence 9 is not live", s.fork, 9, 10)
    rejects(state, ValueError, "fork: sequence 2 already exists", s.fork, 1, 2)
    rejects(state, ValueError, "resume: sequence 1 is not preempted", s.resume, 1)
    rejects(state, ValueError, "append: token count must be an int >= 0, got -1", s.append, 1, -1)
    s.free(2)
    rejects(state, ValueError, "fork: sequence 2 is not live", s.fork, 2, 3)
    rejects(state, ValueError, "free: sequence 2 is not live", s.free, 2)
    s.preempt(1)
    rejects(state, ValueError, "append: sequence 1 is preempted", s.append, 1, 1)
    rejects(state, ValueError, "fork: sequence 1 is preempted", s.fork, 1, 5)
    s.add(5, 16)  # takes all four blocks
    rejects(state, ValueError, "cannot allocate 2 blocks: only 0 are free", s.resume, 1)


def test_without_a_null_block_block_zero_is_handed_out():
    s = seqs(num_blocks=4, null_block=False)
    assert s.add(1, 8) == [0, 1]
    s.free(1)
    assert s.pool.free_queue() == [2, 3, 1, 0]


# -- docs/contract.md §8: token ids and full blocks --------------------------------------------


def caching_seqs(num_blocks=10):
    return SequenceBlocks(BlockPool(num_blocks, prefix_caching=True), tokens_per_block=4, group=1)


def test_every_block_that_fills_is_cached_in_logical_order():
    s = caching_seqs()
    s.add(1, 3, [0, 1, 2])  # [1], partial: nothing cached
    assert s.pool.cached == {}
    s.append(1, 10, list(range(3, 13)))  # 13 tokens: blocks 1, 2, 3 full; 4 partial
    assert s.blocks[1] == [1, 2, 3, 4] and s.tokens[1] == list(range(13))
    assert s.pool.cache_listing() == [(1, 4, [1]), (1, 8, [2]), (1, 12, [3])]
    assert s.pool.block_key(3) == (1, tuple(range(12)))
    s.append(1, 0, [])  # no slots, nothing changes
    assert s.pool.cache_listing() == [(1, 4, [1]), (1, 8, [2]), (1, 12, [3])]
    s.check_invariants()


def test_tokens_follow_fork_preempt_and_free():
    s = caching_seqs()
    s.add(1, 5, [5, 6, 7, 8, 9])
    s.fork(1, 2)
    s.append(2, 1, [4])  # copy-on-write: the child's tokens grow, the parent's do not
    assert s.tokens == {1: [5, 6, 7, 8, 9], 2: [5, 6, 7, 8, 9, 4]}
    s.preempt(1)
    assert s.tokens[1] == [5, 6, 7, 8, 9]  # kept for the resume
    s.free(1)
    s.free(2)
    assert s.tokens == {}
    s.check_invariants()


def test_add_with_computed_tokens_starts_the_row_with_the_hits():
    s = caching_seqs()
    s.add(1, 9, list(range(9)))  # 1, 2, 3; 1 and 2 cached
    s.free(1)  # queue: 4 .. 9, 3, 2, 1
    assert s.add(2, 10, list(range(8)) + [0, 0], computed=8) == [1, 2, 4]
    assert s.pool.free_queue() == [5, 6, 7, 8, 9, 3]
    assert s.pool.ref[1:5].tolist() == [1, 1, 0, 1]
    s.check_invariants()
