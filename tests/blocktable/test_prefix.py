"""Prefix caching (docs/contract.md §8): the implementation (chained hashes, linked free queue)
against the reference (whole-prefix keys, plain lists): the worked example, the
hashes, and seeded random operation sequences compared in whole after every call.
"""

from __future__ import annotations

import functools
import random

import pytest

from blocktable import prefix
from blocktable.pool import BlockPool
from blocktable.reference import BlockPool as ReferencePool
from blocktable.reference import SequenceBlocks as ReferenceSequences
from blocktable.reference import prefix as reference_prefix
from blocktable.sequence import SequenceBlocks


def test_the_contract_example():
    """docs/contract.md §8's example on the implementation (hand-computed in
    tests/reference/test_prefix.py): A = 0..9 -> 1 2 3; freed -> queue 4 5 6 3 2 1;
    B = 0..7 99 98 -> L = 8, row 1 2 4, queue 5 6 3; C -> 5 6 3, queue empty."""
    pool = BlockPool(7, prefix_caching=True)
    groups = [SequenceBlocks(pool, 4)]
    assert prefix.add_request(groups, "A", range(10)) == (0, [[1, 2, 3]])
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2])]
    groups[0].free("A")
    assert pool.free_queue() == [4, 5, 6, 3, 2, 1]
    b = list(range(8)) + [99, 98]
    assert prefix.find_prefix(groups, b) == 8 and prefix.blocks_to_add(groups, b) == 3
    assert prefix.add_request(groups, "B", b) == (8, [[1, 2, 4]])
    assert pool.free_queue() == [5, 6, 3] and pool.ref[1:7].tolist() == [1, 1, 0, 1, 0, 0]
    assert prefix.add_request(groups, "C", [50] * 9) == (0, [[5, 6, 3]])
    assert pool.free_queue() == [] and pool.num_free == 0
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2]), (0, 4, [5]), (0, 8, [6])]


def test_admission_touches_every_group_before_allocating_any():
    """Group 1's hit (block 3) heads the queue; allocating group 0's fresh block before
    touching it would evict it (hand-computed in tests/reference/test_prefix.py)."""
    pool = BlockPool(9, prefix_caching=True)
    groups = [SequenceBlocks(pool, 4, 0), SequenceBlocks(pool, 4, 1)]
    prefix.add_request(groups, "A", [0, 1, 2, 3, 4])  # group 0: 1, 2; group 1: 3, 4
    groups[1].free("A")
    groups[0].free("A")
    pool.allocate(5)
    pool.free([5])
    assert pool.free_queue() == [3, 2, 1, 5]
    assert prefix.blocks_to_add(groups, [0, 1, 2, 3, 9]) == 4
    assert prefix.add_request(groups, "B", [0, 1, 2, 3, 9]) == (4, [[1, 2], [3, 5]])
    assert pool.free_queue() == [] and pool.cache_listing() == [(0, 4, [1]), (1, 4, [3])]


def test_a_block_hash_names_the_whole_prefix_and_the_group():
    data = bytes(8 * 8)  # two blocks of four zero tokens
    h0, h1 = prefix.chain_hashes(prefix.ROOT, data, 4, group=0)
    assert h0 != h1  # same tokens, different parents
    assert prefix.chain_hashes(h0, data[:32], 4, group=0) == [h1]  # chained: resumable from any block
    assert prefix.chain_hashes(prefix.ROOT, data, 4, group=1)[0] != h0
    assert prefix.chain_hashes(prefix.ROOT, data, 8, group=0) != [h0]  # one block of 8 tokens is another key
    assert prefix.chain_hashes(prefix.ROOT, data[:48], 4, group=0) == [h0]  # a partial block has no hash


def test_the_linked_queue_gives_up_a_hit_from_anywhere_in_constant_steps():
    pool = BlockPool(9, null_block=False, prefix_caching=True)
    groups = [SequenceBlocks(pool, 2)]
    prefix.add_request(groups, "A", [1, 2, 3, 4, 5])  # 0, 1, 2; 0 and 1 cached
    groups[0].free("A")
    assert pool.free_queue() == [3, 4, 5, 6, 7, 8, 2, 1, 0]
    pool.touch([1])
    assert pool.free_queue() == [3, 4, 5, 6, 7, 8, 2, 0] and pool.num_free == 8
    pool.touch([0])
    assert pool.free_queue() == [3, 4, 5, 6, 7, 8, 2] and pool.num_free == 7
    pool.free([1, 0])
    assert pool.free_queue() == [3, 4, 5, 6, 7, 8, 2, 1, 0]


def test_bad_prefix_calls_are_rejected_and_change_nothing(rejects):
    """The same refusals as the reference's, with the same messages."""
    pool = BlockPool(6, prefix_caching=True)
    groups = [SequenceBlocks(pool, 4)]
    (s,) = groups
    prefix.add_request(groups, "A", range(6))
    state = (s, pool)
    rejects(state, ValueError, "add: sequence B needs 4 free blocks", prefix.add_request, groups, "B",
            list(range(4)) + [0] * 13)
    rejects(state, ValueError, "token ids must lie in \\[0, 2\\*\\*63\\)", prefix.add_request, groups, "B", [1, -1])
    rejects(state, TypeError, "token ids must be ints, got float64", prefix.add_request, groups, "B", [0.5])
    rejects(state, ValueError, "num_new must be an int in \\[0, 1\\]", prefix.add_request, groups, "B", range(5), 2)
    rejects(state, ValueError, "group indices \\[0, 0\\] are not distinct", prefix.add_request, [s, s], "B", [1])
    rejects(state, ValueError, "add: computed must be a multiple of 4 in \\[0, 5\\], got 2",
            s.add, "B", 5, [0, 1, 2, 3, 4], 2)
    rejects(state, ValueError, "add: logical block 0 of the prefix is not cached in group 0",
            s.add, "B", 5, [9, 1, 2, 3, 4], 4)
    rejects(state, ValueError, "cannot allocate 4 blocks: only 3 are free", s.add, "B", 17, list(range(17)), 4)
    rejects(state, ValueError, "append: 1 tokens given for 2 slots", s.append, "A", 2, [7])
    rejects(state, ValueError, "append: prefix caching needs the ids", s.append, "A", 2)
    rejects(state, ValueError, "touch: block 2 is not cached", pool.touch, [2])
    rejects(state, ValueError, "cache_block: block 1 is cached already", pool.cache_block, b"x" * 16, 1, 0, 4)
    rejects(state, ValueError, "resume: sequence A is not preempted in group 0", prefix.resume_request, groups, "A")


def test_with_prefix_caching_off_the_ring_stays_and_nothing_is_keyed():
    pool = BlockPool(6)
    groups = [SequenceBlocks(pool, 4)]
    assert pool._next is None  # the ring buffer, as before prefix caching existed
    assert prefix.add_request(groups, "A", range(8)) == (0, [[1, 2]])
    groups[0].free("A")
    assert prefix.add_request(groups, "B", range(8)) == (0, [[3, 4]])
    assert pool.cache_listing() == [] and groups[0].tokens == {} and not pool.is_cached(3)
    assert pool.reset_prefix_cache() is False
    with pytest.raises(ValueError, match="touch: prefix caching is off"):
        pool.touch([3])


# -- seeded random operation sequences, both sides in lockstep ----------------------------------


class Pair:
    """One world on both sides: a pool and one SequenceBlocks per group each. `call` runs
    an operation on both (same outcome, same error type), `compare` the whole state."""

    def __init__(self, rng: random.Random, prefix_caching: bool = True) -> None:
        self.rng = rng
        self.num_blocks = rng.randint(3, 24)
        null_block = rng.random() < 0.7
        self.sizes = [rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.choice([1, 1, 2, 3]))]
        self.ref_pool = ReferencePool(self.num_blocks, null_block, prefix_caching=prefix_caching)
        self.pool = BlockPool(self.num_blocks, null_block, prefix_caching=prefix_caching)
        self.ref = [ReferenceSequences(self.ref_pool, S, g) for g, S in enumerate(self.sizes)]
        self.impl = [SequenceBlocks(self.pool, S, g) for g, S in enumerate(self.sizes)]
        # A few shared prompt stems over a 3-token alphabet: hits, misses after a shared
        # stem, and two blocks under one key all come often.
        self.stems = [[rng.randint(0, 2) for _ in range(20)] for _ in range(3)]
        self.next_seq = 0

    def call(self, ref_call, impl_call):
        outcomes = []
        for call in (ref_call, impl_call):
            try:
                outcomes.append((None, call()))
            except (ValueError, TypeError) as e:
                outcomes.append((type(e), None))
        (ref_error, ref_out), (impl_error, impl_out) = outcomes
        assert ref_error is impl_error, f"the reference gave {ref_error}, the implementation {impl_error}"
        if hasattr(ref_out, "cow"):
            ref_out, impl_out = (ref_out.cow, ref_out.new), (impl_out.cow, impl_out.new)
        assert ref_out == impl_out

    def each_group(self, op, *args):
        for ref, impl in zip(self.ref, self.impl):
            self.call(functools.partial(getattr(ref, op), *args), functools.partial(getattr(impl, op), *args))

    def tokens(self, n):
        return [self.rng.randint(0, 2) for _ in range(n)]

    def step(self):
        rng, ref0 = self.rng, self.ref[0]
        live, preempted = list(ref0.blocks), sorted(ref0.preempted)
        op = rng.choice(["add", "add", "append", "append", "append", "fork", "free", "preempt", "resume",
                         "resume_request", "reset", "refused"])
        if op == "add":
            tokens = rng.choice(self.stems)[:rng.randint(0, 20)] + self.tokens(rng.randint(0, 4))
            num_new = None if rng.random() < 0.6 else rng.randint(0, 3)
            seq, self.next_seq = self.next_seq, self.next_seq + 1
            self.call(lambda: reference_prefix.blocks_to_add(self.ref, tokens, num_new),
                      lambda: prefix.blocks_to_add(self.impl, tokens, num_new))
            self.call(lambda: reference_prefix.add_request(self.ref, seq, tokens, num_new),
                      lambda: prefix.add_request(self.impl, seq, tokens, num_new))
        elif op == "append" and live:
            seq, n = rng.choice(live), rng.randint(0, 7)
            tokens = self.tokens(n)
            # As a scheduler does: every group's growth must fit in the one pool.
            if sum(g.blocks_needed(seq, n) for g in self.ref) <= self.ref_pool.num_free:
                self.each_group("append", seq, n, tokens)
        elif op == "fork" and live:
            parent, self.next_seq = rng.choice(live), self.next_seq + 1
            self.each_group("fork", parent, self.next_seq - 1)
        elif op == "free" and live + preempted:
            self.each_group("free", rng.choice(live + preempted))
        elif op == "preempt" and live:
            self.each_group("preempt", rng.choice(live))
        elif op == "resume" and preempted:
            seq = rng.choice(preempted)
            if sum(-(-g.num_tokens[seq] // g.tokens_per_block) for g in self.ref) <= self.ref_pool.num_free:
                self.each_group("resume", seq)
        elif op == "resume_request" and preempted:
            seq = rng.choice(preempted)
            self.call(lambda: reference_prefix.resume_request(self.ref, seq),
                      lambda: prefix.resume_request(self.impl, seq))
        elif op == "reset":
            self.call(self.ref_pool.reset_prefix_cache, self.pool.reset_prefix_cache)
        elif op == "refused":
            self.refuse(rng.randint(0, 4), live)

    def refuse(self, kind, live):
        """A call both sides must refuse, changing nothing (compared after)."""
        b, ghost = self.rng.randrange(self.num_blocks), self.next_seq + 1000
        if kind == 0 and not self.ref_pool.is_cached(b):
            self.call(lambda: self.ref_pool.touch([b]), lambda: self.pool.touch([b]))
        elif kind == 1:
            self.call(lambda: reference_prefix.add_request(self.ref, ghost, [1, -1]),
                      lambda: prefix.add_request(self.impl, ghost, [1, -1]))
        elif kind == 2 and live:
            self.each_group("append", live[0], 2, [1])
        elif kind == 3:  # a hit past what fits (or not cached at all)
            n = 8 + 6 * self.num_blocks
            self.call(lambda: self.ref[0].add(ghost, n, [0] * n, self.sizes[0]),
                      lambda: self.impl[0].add(ghost, n, [0] * n, self.sizes[0]))
        elif kind == 4:
            self.call(lambda: self.ref_pool.allocate(self.ref_pool.num_free + 1),
                      lambda: self.pool.allocate(self.pool.num_free + 1))

    def compare(self, where):
        assert self.ref_pool.ref.tolist() == self.pool.ref.tolist(), f"{where}: ref counts"
        assert self.ref_pool.free_queue() == self.pool.free_queue(), f"{where}: free queue"
        assert self.ref_pool.num_free == self.pool.num_free, f"{where}: free count"
        assert self.ref_pool.cache_listing() == self.pool.cache_listing(), f"{where}: cache map"
        for g, (ref, impl) in enumerate(zip(self.ref, self.impl)):
            assert ref.blocks == impl.blocks, f"{where}: group {g} block lists"
            assert ref.num_tokens == impl.num_tokens and ref.preempted == impl.preempted, f"{where}: group {g}"
            assert ref.tokens == impl.tokens, f"{where}: group {g} token ids"
            assert ref.take_cow_pairs() == impl.take_cow_pairs(), f"{where}: group {g} copy-on-write pairs"
        self.ref_pool.check_invariants([t for s in self.ref for t in s.live_tables()])
        for s in self.ref:
            s.check_cache_keys()


@pytest.mark.parametrize("seed", range(40))
def test_random_operations_agree_with_the_reference_after_every_call(seed):
    pair = Pair(random.Random(seed))
    for step in range(150):
        pair.step()
        pair.compare(f"seed {seed} step {step}")


@pytest.mark.parametrize("seed", range(8))
def test_with_prefix_caching_off_token_ids_change_nothing(seed):
    """The same operations, prefix caching off: ids are checked and dropped, no lookup
    hits, and both sides still agree (the §6 paths, reached through the new calls)."""
    pair = Pair(random.Random(seed), prefix_caching=False)
    for step in range(150):
        pair.step()
        pair.compare(f"seed {seed} step {step}")
    assert pair.pool.cache_listing() == [] and all(not s.tokens for s in pair.impl)
