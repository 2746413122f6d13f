"""Fork, copy-on-write, free and preempt/resume: the implementation against the
reference on the same operations; ids, pools and copy pairs must agree."""

import pytest

from blocktable.pool import BlockPool
from blocktable.properties.lockstep.check import check_pool
from blocktable.reference import BlockPool as ReferencePool
from blocktable.reference import SequenceBlocks as ReferenceSequences
from blocktable.sequence import SequenceBlocks

SCRIPT = [
    ("add", 1, 6), ("fork", 1, 2), ("append", 2, 1), ("fork", 2, 3), ("fork", 3, 4),
    ("append", 1, 9), ("append", 4, 2), ("append", 3, 0), ("free", 2), ("preempt", 1),
    ("add", 5, 3), ("resume", 1), ("append", 1, 4), ("fork", 5, 6), ("append", 6, 1),
    ("append", 5, 1), ("free", 5), ("preempt", 3), ("free", 3), ("free", 4), ("free", 6), ("free", 1),
]


def run(sides, op, *args):
    results = [getattr(side, op)(*args) for side in sides]
    return results


@pytest.mark.parametrize("tokens_per_block", [1, 4, 16])
def test_scripted_sequences_match_the_reference(tokens_per_block):
    ref = ReferenceSequences(ReferencePool(40), tokens_per_block)
    impl = SequenceBlocks(BlockPool(40), tokens_per_block)
    for step, (op, *args) in enumerate(SCRIPT):
        r, i = run((ref, impl), op, *args)
        if op == "append":
            assert (r.cow, r.new) == (i.cow, i.new), f"step {step}"
        else:
            assert r == i, f"step {step}"
        assert ref.blocks == impl.blocks and ref.num_tokens == impl.num_tokens
        assert ref.take_cow_pairs() == impl.take_cow_pairs()
        check_pool(ref.pool, impl.pool, note=f"step {step} {op}{args}")
        ref.check_invariants()
    assert impl.pool.num_free == 39


def test_copy_on_write_matches_spec_by_hand():
    s = SequenceBlocks(BlockPool(10), 4)
    s.add(1, 6)  # [1, 2]; block 2 partly filled
    s.fork(1, 2)
    growth = s.append(2, 1)
    assert growth.cow == (2, 3) and growth.new == []
    assert s.blocks == {1: [1, 2], 2: [1, 3]}
    assert s.pool.ref[1:4].tolist() == [2, 1, 1]
    assert s.take_cow_pairs() == [(2, 3)]


def test_bad_sequence_calls_are_rejected_and_change_nothing(rejects):
    s = SequenceBlocks(BlockPool(5), 4)
    s.add(1, 6)
    s.fork(1, 2)
    state = (s, s.pool)
    rejects(state, ValueError, "append: sequence 2 needs 3 blocks, only 2 free", s.append, 2, 9)
    rejects(state, ValueError, "add: sequence 1 already exists", s.add, 1, 3)
    rejects(state, ValueError, "fork: sequence 9 is not live", s.fork, 9, 10)
    rejects(state, ValueError, "resume: sequence 1 is not preempted", s.resume, 1)
    s.free(2)
    rejects(state, ValueError, "fork: sequence 2 is not live", s.fork, 2, 3)
    s.preempt(1)
    rejects(state, ValueError, "append: sequence 1 is preempted", s.append, 1, 1)


@pytest.mark.parametrize("tokens_per_block", [1, 4, 16])
def test_scripted_sequences_with_prefix_caching_match_the_reference(tokens_per_block):
    """The same script with token ids (a small alphabet, so that sequences share
    prefixes): rows, ids, copies, the queue and the cache map must agree."""
    ref = ReferenceSequences(ReferencePool(40, prefix_caching=True), tokens_per_block, group=2)
    impl = SequenceBlocks(BlockPool(40, prefix_caching=True), tokens_per_block, group=2)
    for step, (op, *args) in enumerate(SCRIPT):
        if op in ("add", "append"):
            seq, n = args
            args = [seq, n, [(seq * 7 + i) % 3 for i in range(ref.num_tokens.get(seq, 0), ref.num_tokens.get(seq, 0) + n)]]
        r, i = run((ref, impl), op, *args)
        if op == "append":
            assert (r.cow, r.new) == (i.cow, i.new), f"step {step}"
        else:
            assert r == i, f"step {step}"
        assert ref.blocks == impl.blocks and ref.num_tokens == impl.num_tokens and ref.tokens == impl.tokens
        assert ref.take_cow_pairs() == impl.take_cow_pairs()
        check_pool(ref.pool, impl.pool, note=f"step {step} {op}{args}")
        assert ref.pool.cache_listing() == impl.pool.cache_listing(), f"step {step}"
        ref.check_invariants()
    assert impl.pool.num_free == 39
    assert ref.pool.cache_listing() and ref.pool.reset_prefix_cache() is impl.pool.reset_prefix_cache() is True
