"""Our pool through docs/contract.md §11's protocol (blocktable/classes/pool.py) is
the reference pool, call for call: the protocol's touch revives a cached free block
and shares a block in use, keys are opaque, the accessors read the state."""

import pytest

from blocktable.classes.pool import Pool
from blocktable.reference import BlockPool as ReferencePool


@pytest.mark.parametrize("free_order", ["tail", "vllm"])
def test_a_script_through_the_protocol_is_the_reference(free_order):
    ours = Pool(num_blocks=8, null_block=True, prefix_caching=True, free_order=free_order)
    ref = ReferencePool(8, prefix_caching=True, free_order=free_order)

    def same():
        assert ours.free_queue() == ref.free_queue() and ours.num_free() == ref.num_free
        assert [ours.ref(b) for b in range(8)] == ref.ref.tolist()
        assert [(key, blocks) for key, blocks in ours.cache_map()] == \
            [(key[1], blocks) for key, blocks in ref.cached.items()]

    a = ours.allocate(3)
    assert a == ref.allocate(3) == [1, 2, 3]
    for key, b in (("k1", 1), ("k2", 2)):
        ours.cache(b, key)
        ref.cache_block((0, key), b)
    ours.touch([1, 3])  # a fork: both in use, each gains a holder
    ref.share([1, 3])
    same()
    ours.free([3, 2, 1])
    ref.free([3, 2, 1])
    ours.free([3, 1])
    ref.free([3, 1])
    same()
    assert ours.lookup("k1") == 1 and ours.lookup("k3") is None
    ours.touch([1])  # a prefix hit on a free, cached block: it leaves the queue
    ref.touch([1])
    same()
    assert ours.reset_prefix_cache() is False
    ours.free([1])
    ref.free([1])
    assert ours.reset_prefix_cache() is ref.reset_prefix_cache() is True
    same()


def test_a_refused_call_raises_and_changes_nothing(rejects):
    pool = Pool(num_blocks=5, null_block=True, prefix_caching=False, free_order="tail")
    pool.allocate(2)
    rejects(pool, ValueError, "cannot allocate 3 blocks", pool.allocate, 3)
    rejects(pool, ValueError, "listed twice", pool.touch, [1, 1])
    rejects(pool, ValueError, "prefix caching is off", pool.touch, [3])
    rejects(pool, ValueError, "double free", pool.free, [3])
