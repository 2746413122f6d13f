"""docs/contract.md §8: prefix caching on the reference: the worked example, then one test
per rule (lookup, touch, eviction, free keeping keys, reset, copy-on-write, the
admission order across groups, bad input, the invariants).

Unless a test says otherwise: null block on, tokens_per_block S = 4, so logical block
j covers tokens [4j, 4j + 4) and its key is (group, tokens[0:4j + 4]).
"""

import pytest

from blocktable.reference import BlockPool, InvariantError, SequenceBlocks
from blocktable.reference.prefix import add_request, blocks_to_add, find_prefix, resume_request


def world(num_blocks, *tokens_per_block, prefix_caching=True):
    """A pool and one SequenceBlocks per group (group g has tokens_per_block[g])."""
    pool = BlockPool(num_blocks, prefix_caching=prefix_caching)
    return pool, [SequenceBlocks(pool, S, group=g) for g, S in enumerate(tokens_per_block or (4,))]


def check(groups):
    groups[0].pool.check_invariants([t for s in groups for t in s.live_tables()])
    for s in groups:
        s.check_cache_keys()


def test_the_contract_example():
    """docs/contract.md §8's example, one replicated group, K = 4, 7 blocks (null block 0).

    1. A = tokens 0..9 gets cdiv(10, 4) = 3 blocks from the head: 1, 2, 3. Blocks 1 and 2
       are full (tokens 0..3 and 4..7) and are cached; block 3 holds 8, 9 only.
    2. A finishes: free [3, 2, 1] (last block first) appends them to the queue 4, 5, 6.
    3. B = tokens 0..7, 99, 98: L <= 10 - 1 = 9, multiple of 4, blocks 0 and 1 cached -> 8.
       Touch 1 and 2 (out of the queue's tail), allocate cdiv(10, 4) - 2 = 1 block: 4.
    4. C (nothing cached in common) needs 3 fresh blocks: 5, 6, 3. Block 3 was never full,
       so never cached; blocks 1 and 2 are held by B, so the empty queue cannot evict them.
    """
    pool, groups = world(7)
    (s,) = groups
    a = list(range(10))
    assert add_request(groups, "A", a) == (0, [[1, 2, 3]])
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2])]
    assert pool.cached == {(0, (0, 1, 2, 3)): [1], (0, (0, 1, 2, 3, 4, 5, 6, 7)): [2]}
    s.free("A")
    assert pool.free_queue() == [4, 5, 6, 3, 2, 1]
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2])]  # free keeps keys
    check(groups)

    b = list(range(8)) + [99, 98]
    assert find_prefix(groups, b) == 8
    assert blocks_to_add(groups, b) == 3  # 1 fresh + the 2 hits now in the queue
    assert add_request(groups, "B", b) == (8, [[1, 2, 4]])  # positions 8, 9 are scheduled
    assert pool.free_queue() == [5, 6, 3]
    assert pool.ref[1:7].tolist() == [1, 1, 0, 1, 0, 0]
    check(groups)

    assert add_request(groups, "C", [50] * 9) == (0, [[5, 6, 3]])
    assert pool.free_queue() == []
    # C's blocks 5 and 6 are full, so cached too; 1 and 2 are B's and stay.
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2]), (0, 4, [5]), (0, 8, [6])]
    check(groups)


def test_lookup_leaves_at_least_one_token_to_compute():
    """A prompt that is wholly cached still computes its last token: L <= len - 1. The
    block holding it is fresh and, once full, joins its key as a second block."""
    pool, groups = world(8)
    add_request(groups, "A", list(range(8)))  # blocks 1, 2, both full and cached
    assert find_prefix(groups, list(range(8))) == 4  # not 8: 8 > 8 - 1
    assert add_request(groups, "B", list(range(8))) == (4, [[1, 3]])
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2, 3])]  # two requests, one key, both blocks stay
    assert find_prefix(groups, list(range(9))) == 8
    assert find_prefix(groups, []) == 0 and find_prefix(groups, [0]) == 0
    check(groups)


def test_lookup_stops_at_the_first_uncached_block_and_keys_hold_the_whole_prefix():
    pool, groups = world(10)
    add_request(groups, "A", list(range(13)))  # blocks 1, 2, 3 full (keys over 4, 8, 12 tokens)
    assert find_prefix(groups, list(range(12)) + [7]) == 12
    # Block 1's tokens differ: nothing past it is a hit, although blocks 2 and 3's own
    # tokens (4..11) are the same: a key is the whole prefix, not the block's tokens.
    assert find_prefix(groups, [0, 1, 2, 9] + list(range(4, 13))) == 0
    assert find_prefix(groups, [0, 1, 2, 3, 4, 5, 6, 9] + list(range(8, 13))) == 4


def test_lookup_length_is_a_multiple_of_every_groups_block():
    """Groups with S = 4 and S = 6 (lcm 12). A = 25 tokens: group 0 has 6 full blocks
    (24 tokens), group 1 has 4 (24 tokens), all cached.
    B = A's first 20 tokens then 77: L <= 20; group 0 has blocks below 20 cached (5 blocks),
    group 1 below 18 (3 blocks, a fourth would end at 24 > 20); min is 18 -> the
    largest multiple of 12 below it: 12."""
    pool, groups = world(30, 4, 6)
    a = list(range(25))
    assert add_request(groups, "A", a)[0] == 0
    assert [s.num_tokens["A"] for s in groups] == [25, 25]
    assert find_prefix(groups, a[:20] + [77]) == 12
    assert find_prefix(groups, a) == 24  # 24 <= 24, multiple of 12, every block below it cached
    assert find_prefix(groups[:1], a[:20] + [77]) == 20  # group 0 alone: every multiple of 4
    L, rows = add_request(groups, "B", a[:20] + [77])
    # Group 0: 3 hits (blocks of A's row at 0..2), then cdiv(21, 4) - 3 = 3 fresh.
    # Group 1: 2 hits, then cdiv(21, 6) - 2 = 2 fresh.
    assert L == 12 and rows[0][:3] == groups[0].blocks["A"][:3] and rows[1][:2] == groups[1].blocks["A"][:2]
    assert [len(r) for r in rows] == [6, 4]
    check(groups)


def test_every_group_must_have_the_prefix_cached():
    """Group 1's blocks are evicted while group 0's stay: no hit at all."""
    pool, groups = world(8, 4, 4)
    add_request(groups, "A", list(range(9)))  # group 0: 1, 2, 3; group 1: 4, 5, 6
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2]), (1, 4, [4]), (1, 8, [5])]
    groups[1].free("A")  # queue: 7, 6, 5, 4
    groups[0].free("A")  # queue: 7, 6, 5, 4, 3, 2, 1
    assert pool.allocate(4) == [7, 6, 5, 4]  # evicts group 1's keys
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2])]
    assert find_prefix(groups[:1], list(range(9))) == 8
    assert find_prefix(groups, list(range(9))) == 0


def test_admission_touches_every_group_before_allocating_any():
    """Group 1's hit (block 3) is at the head of the queue. Touching group 0's hit and
    allocating group 0's fresh block first would pop block 3 and evict the key the
    lookup counted on; docs/contract.md §8 touches all the hits first.

    A = tokens 0..4 in two groups: group 0 [1, 2], group 1 [3, 4]; blocks 1 and 3 full.
    Free group 1 then group 0: queue 5 6 7 8 4 3 2 1. Others take 5 6 7 8 4 and give 5
    back: queue 3 2 1 5. B = 0 1 2 3 9: L = 4, hits 1 (group 0) and 3 (group 1).
    Touch 1 and 3 -> queue 2 5; group 0's fresh block is 2, group 1's is 5.
    """
    pool, groups = world(9, 4, 4)
    add_request(groups, "A", [0, 1, 2, 3, 4])
    groups[1].free("A")
    groups[0].free("A")
    others = pool.allocate(5)
    pool.free([5])
    assert pool.free_queue() == [3, 2, 1, 5]
    assert blocks_to_add(groups, [0, 1, 2, 3, 9]) == 4  # 2 fresh + 2 hits in the queue = every free block
    assert add_request(groups, "B", [0, 1, 2, 3, 9]) == (4, [[1, 2], [3, 5]])
    assert pool.free_queue() == []
    pool.check_invariants([t for s in groups for t in s.live_tables()] + [others[1:]])


def test_a_hit_in_use_gains_a_ref_and_a_free_hit_leaves_the_queue_from_the_middle():
    pool, groups = world(12)
    (s,) = groups
    add_request(groups, "A", list(range(9)))  # 1, 2, 3
    add_request(groups, "X", [40] * 5)  # 4, 5; block 4 cached under X's prefix
    add_request(groups, "B", list(range(8)) + [5])  # L = 8: hits 1, 2 in use
    assert s.blocks["B"] == [1, 2, 6] and pool.ref[1:3].tolist() == [2, 2]
    s.free("A")  # 3 -> queue; 2, 1 stay held by B
    s.free("B")  # 6, 2, 1 -> queue
    assert pool.free_queue() == [7, 8, 9, 10, 11, 3, 6, 2, 1]
    add_request(groups, "C", list(range(4)) + [1])  # L = 4: block 1, from the tail
    assert pool.free_queue() == [8, 9, 10, 11, 3, 6, 2]  # 1 left; then 7 was popped for C's last token
    s.free("X")  # 5, 4 -> queue
    add_request(groups, "D", list(range(8)) + [0])  # L = 8: 1 in use (ref 2), 2 from the middle
    assert s.blocks["D"] == [1, 2, 8]
    assert pool.free_queue() == [9, 10, 11, 3, 6, 5, 4]
    assert pool.ref[1] == 2 and pool.ref[2] == 1
    check(groups)


def test_eviction_takes_a_block_off_its_key_and_the_key_goes_when_empty():
    pool, groups = world(8)
    (s,) = groups
    add_request(groups, "A", list(range(5)))  # 1, 2; block 1 under key (0..3)
    add_request(groups, "B", list(range(4)))  # L = 0 (4 - 1 < 4): block 3, full, second under the key
    assert pool.cache_listing() == [(0, 4, [1, 3])]
    s.free("A")  # queue: 4, 5, 6, 7, 2, 1
    s.free("B")  # queue: 4, 5, 6, 7, 2, 1, 3
    assert pool.allocate(6) == [4, 5, 6, 7, 2, 1]  # 1 is evicted; 3 keeps the key
    assert pool.cache_listing() == [(0, 4, [3])]
    pool.free([4])  # queue: 3, 4
    assert add_request(groups, "C", list(range(4)) + [8]) == (4, [[3, 4]])  # the hit is now block 3
    s.free("C")  # queue: 4, 3
    assert pool.allocate(2) == [4, 3]
    assert pool.cache_listing() == []  # the key went with its last block
    assert find_prefix(groups, list(range(5))) == 0


def test_free_keeps_keys_and_a_finished_requests_tail_is_evicted_first():
    pool, groups = world(6)
    (s,) = groups
    add_request(groups, "A", list(range(12)))  # 1, 2, 3: all full
    s.free("A")  # queue: 4, 5, 3, 2, 1
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2]), (0, 12, [3])]
    pool.allocate(3)  # 4, 5 and A's last block 3
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [2])]
    assert find_prefix(groups, list(range(12)) + [0]) == 8


def test_reset_prefix_cache_only_when_no_block_is_in_use():
    pool, groups = world(6)
    (s,) = groups
    add_request(groups, "A", list(range(9)))
    before = (pool.cache_listing(), list(pool.free_queue()), pool.ref.tolist())
    assert pool.reset_prefix_cache() is False
    assert (pool.cache_listing(), pool.free_queue(), pool.ref.tolist()) == before
    s.free("A")
    queue = list(pool.free_queue())
    assert pool.reset_prefix_cache() is True
    assert pool.cached == {} and pool.free_queue() == queue  # the queue keeps its order
    assert find_prefix(groups, list(range(9))) == 0
    assert pool.reset_prefix_cache() is True  # nothing cached, nothing in use
    check(groups)


def test_copy_on_write_of_a_partial_block_and_the_copy_is_cached_once_full():
    pool, groups = world(10)
    (s,) = groups
    add_request(groups, "A", list(range(6)))  # 1 (full, cached), 2 (tokens 4, 5)
    s.fork("A", "B")  # B shares 1 and 2; refs 2, 2
    assert s.tokens["B"] == s.tokens["A"]
    g = s.append("B", 2, [6, 7])  # 2 is shared and partial: copy to 3, then fill it
    assert (g.cow, g.new) == ((2, 3), [])
    assert s.blocks == {"A": [1, 2], "B": [1, 3]} and pool.ref[1:4].tolist() == [2, 1, 1]
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [3])]
    g = s.append("A", 2, [6, 9])  # 2 is A's alone now: written in place, then full
    assert (g.cow, g.new) == (None, [])
    assert pool.cache_listing() == [(0, 4, [1]), (0, 8, [3]), (0, 8, [2])]
    assert pool.block_key(2) == (0, (0, 1, 2, 3, 4, 5, 6, 9))
    s.fork("A", "C")
    g = s.append("C", 1, [10])  # A's blocks are full: no copy, a fresh block
    assert (g.cow, g.new) == (None, [4])
    check(groups)


def test_resume_request_hits_the_blocks_it_gave_back():
    pool, groups = world(8)
    (s,) = groups
    add_request(groups, "A", list(range(10)))  # 1, 2, 3
    s.preempt("A")  # queue: 4, 5, 6, 7, 3, 2, 1
    assert resume_request(groups, "A") == (8, [[1, 2, 4]])
    assert s.num_tokens["A"] == 10 and s.tokens["A"] == list(range(10))
    # The plain resume allocates afresh and caches its full blocks beside the old ones.
    s.preempt("A")
    assert s.resume("A") == [5, 6, 7]
    assert pool.cache_listing() == [(0, 4, [1, 5]), (0, 8, [2, 6])]
    check(groups)


def test_with_prefix_caching_off_nothing_is_keyed():
    pool, groups = world(6, prefix_caching=False)
    (s,) = groups
    assert add_request(groups, "A", list(range(8))) == (0, [[1, 2]])
    s.free("A")
    assert add_request(groups, "B", list(range(8))) == (0, [[3, 4]])
    assert pool.cached == {} and pool.cache_listing() == [] and s.tokens == {}
    assert s.add("C", 4, [1, 2, 3, 4]) == [5]  # ids checked, then dropped
    assert pool.reset_prefix_cache() is False
    with pytest.raises(ValueError, match="prefix caching is off"):
        pool.touch([1])
    with pytest.raises(ValueError, match="prefix caching is off"):
        s.add("D", 4, [0, 1, 2, 3], computed=4)


def test_bad_prefix_calls_are_rejected_and_change_nothing(rejects):
    pool, groups = world(6)
    (s,) = groups
    add_request(groups, "A", list(range(6)))  # 1, 2
    state = (s, pool)
    rejects(state, ValueError, "add: sequence B needs 4 free blocks \\(fresh ones and cached ones to revive\\), "
                               "only 3 are free", add_request, groups, "B", list(range(4)) + [0] * 13)
    rejects(state, ValueError, "token ids must lie in \\[0, 2\\*\\*63\\)", add_request, groups, "B", [1, -1])
    rejects(state, TypeError, "token ids must be ints, got float64", add_request, groups, "B", [0.5])
    rejects(state, TypeError, "tokens must be a flat sequence", add_request, groups, "B", [[1, 2]])
    rejects(state, ValueError, "num_new must be an int in \\[0, 1\\]", add_request, groups, "B", list(range(5)), 2)
    rejects(state, ValueError, "add: sequence A already exists", add_request, groups, "A", [1])
    rejects(state, ValueError, "the groups must share one pool", add_request,
            [s, SequenceBlocks(BlockPool(6, prefix_caching=True), 4, 1)], "B", [1])
    rejects(state, ValueError, "group indices \\[0, 0\\] are not distinct", add_request, [s, s], "B", [1])
    rejects(state, ValueError, "no KV-cache groups", add_request, [], "B", [1])
    rejects(state, ValueError, "add: computed must be a multiple of 4 in \\[0, 5\\], got 2",
            s.add, "B", 5, [0, 1, 2, 3, 4], 2)
    rejects(state, ValueError, "add: logical block 0 of the prefix is not cached in group 0",
            s.add, "B", 5, [9, 1, 2, 3, 4], 4)
    rejects(state, ValueError, "cannot allocate 4 blocks: only 3 are free",
            s.add, "B", 17, list(range(17)), 4)
    rejects(state, ValueError, "add: prefix caching needs the ids", s.add, "B", 3)
    rejects(state, ValueError, "append: 1 tokens given for 2 slots", s.append, "A", 2, [7])
    rejects(state, ValueError, "append: prefix caching needs the ids", s.append, "A", 2)
    rejects(state, ValueError, "touch: block 2 is not cached", pool.touch, [2])
    rejects(state, ValueError, "touch: block 1 is listed twice", pool.touch, [1, 1])
    rejects(state, ValueError, "cache_block: block 1 is cached already", pool.cache_block, (0, (5, 5, 5, 5)), 1)
    rejects(state, ValueError, "cache_block: block 3 is free", pool.cache_block, (0, (5, 5, 5, 5)), 3)
    rejects(state, ValueError, "resume: sequence A is not preempted in group 0", resume_request, groups, "A")


def test_hit_blocks_that_sit_in_the_queue_count_against_the_free_blocks(rejects):
    """Touching takes a free hit out of the queue, so the fresh blocks must fit in what is
    left: the check comes before any touch."""
    pool, groups = world(5)
    (s,) = groups
    add_request(groups, "A", list(range(5)))  # 1, 2
    s.free("A")  # queue 3, 4, 2, 1; block 1 cached
    # 4 fresh blocks plus the hit 1: 5 > 4, although 4 fresh blocks alone would fit.
    rejects((s, pool), ValueError, "cannot allocate 4 blocks: only 3 are free once its hits leave the free queue",
            s.add, "B", 20, list(range(4)) + [0] * 16, 4)
    assert blocks_to_add(groups, list(range(4)) + [0] * 16) == 5


# -- the invariants, broken by hand --------------------------------------------------------


def cached_world():
    pool, groups = world(8)
    add_request(groups, "A", list(range(9)))  # 1, 2 cached, 3 partial
    check(groups)
    return pool, groups[0]


@pytest.mark.parametrize("breakage, invariant, block", [
    (lambda pool, s: pool.cached.__setitem__((0, (9, 9, 9, 9)), [1]), "cached-once", 1),
    (lambda pool, s: pool.cached[(0, (0, 1, 2, 3))].append(1), "cached-once", 1),
    (lambda pool, s: pool.cached.__setitem__((0, (7, 7, 7, 7)), []), "cache-key-empty", None),
    (lambda pool, s: pool.cached.__setitem__((0, (7, 7, 7, 7)), [0]), "cache-block-lost", 0),
    (lambda pool, s: pool.cached.__setitem__((0, (7, 7, 7, 7)), [8]), "cache-block-lost", 8),
])
def test_the_pool_names_a_broken_cache_invariant(breakage, invariant, block):
    pool, s = cached_world()
    breakage(pool, s)
    with pytest.raises(InvariantError) as info:
        pool.check_invariants(s.live_tables())
    assert (info.value.invariant, info.value.block) == (invariant, block)


@pytest.mark.parametrize("breakage, block, state", [
    (lambda pool: pool.cached.__setitem__((0, (0, 1, 2, 9)), pool.cached.pop((0, (0, 1, 2, 3)))), 1,
     "cached under another prefix"),
    (lambda pool: pool.cached.pop((0, tuple(range(8)))), 2, "not cached"),
    (lambda pool: pool.cached.__setitem__((0, tuple(range(12))), [3]), 3, "cached"),
])
def test_a_table_whose_blocks_disagree_with_the_map_is_named(breakage, block, state):
    pool, s = cached_world()
    breakage(pool)
    pool.check_invariants(s.live_tables())  # the map alone is consistent
    with pytest.raises(InvariantError, match=f"block {block}, logical block .* is {state}$") as info:
        s.check_cache_keys()
    assert (info.value.invariant, info.value.block) == ("cache-key-matches-table", block)
