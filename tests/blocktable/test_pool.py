"""The ring-buffer pool hands out the same ids as the reference's FIFO list."""

import pytest

from blocktable.pool import BlockPool
from blocktable.properties.lockstep.check import check_pool
from blocktable.reference import BlockPool as ReferencePool


@pytest.mark.parametrize("free_order", ["tail", "vllm"])
@pytest.mark.parametrize("null_block", [True, False])
def test_scripted_pool_matches_the_reference(null_block, free_order):
    ref, impl = ReferencePool(9, null_block, free_order=free_order), BlockPool(9, null_block, free_order=free_order)
    held: list[list[int]] = []
    script = [("allocate", 3), ("allocate", 2), ("share", 0), ("free", 1), ("allocate", 4),
              ("free", 0), ("free", 0), ("allocate", 1), ("free", 1), ("free", 0), ("allocate", 5),
              ("free", 0), ("allocate", 2), ("allocate", 1), ("free", 0), ("free", 0)]
    for step, (op, arg) in enumerate(script):
        if op == "allocate":
            ids = ref.allocate(arg)
            assert impl.allocate(arg) == ids, f"step {step}"
            held.append(ids)
        elif op == "share":
            ref.share(held[arg])
            impl.share(held[arg])
            held.append(list(held[arg]))
        else:
            ids = held.pop(arg)[::-1]
            ref.free(ids)
            impl.free(ids)
        check_pool(ref, impl, note=f"step {step} {op}")
        ref.check_invariants(held)


@pytest.mark.parametrize("free_order", ["tail", "vllm"])
def test_the_ring_wraps_around_many_times(free_order):
    ref, impl = ReferencePool(5, free_order=free_order), BlockPool(5, free_order=free_order)
    for round in range(20):
        a = ref.allocate(3)
        assert impl.allocate(3) == a
        ref.free([a[1]])
        impl.free([a[1]])
        ref.free([a[2], a[0]])
        impl.free([a[2], a[0]])
        check_pool(ref, impl, note=f"round {round}")


def test_bad_pool_calls_are_rejected_and_change_nothing(rejects):
    pool = BlockPool(5)
    pool.allocate(2)
    rejects(pool, ValueError, "cannot allocate 3 blocks: only 2 are free", pool.allocate, 3)
    rejects(pool, ValueError, "free: block 2 is listed twice in one call", pool.free, [2, 1, 2])
    rejects(pool, ValueError, "free: double free of block 3", pool.free, [1, 3])
    rejects(pool, ValueError, "free: block 0 is the null block", pool.free, [0])
    rejects(pool, ValueError, "free: block 5 is out of range \\[0, 5\\)", pool.free, [5])
    rejects(pool, TypeError, "free: block ids must be ints", pool.free, [1.0])
    rejects(pool, ValueError, "share: block 4 is free", pool.share, [4])
    rejects(pool, ValueError, "unshare: block 1 has ref 1", pool.unshare, 1)
    rejects(pool, ValueError, "allocate needs a count >= 0", pool.allocate, -2)


# -- prefix caching: the linked free queue and the cache map ------------------------------------


def both_cached(null_block=True, free_order="tail"):
    return (ReferencePool(16, null_block, prefix_caching=True, free_order=free_order),
            BlockPool(16, null_block, prefix_caching=True, free_order=free_order))


def same_cache(what, ref, impl):
    check_pool(ref, impl, note=what)
    assert ref.cache_listing() == impl.cache_listing(), what
    assert ref.num_free == impl.num_free, what


@pytest.mark.parametrize("free_order", ["tail", "vllm"])
@pytest.mark.parametrize("null_block", [True, False])
def test_scripted_caching_pool_matches_the_reference(null_block, free_order):
    """The §6 script again, with all but every third block handed out cached under a key
    of its own (so that a free mixes cached and uncached blocks) and, every third step,
    the oldest cached free block touched back into use."""
    ref, impl = both_cached(null_block, free_order)
    held: list[list[int]] = []
    script = [("allocate", 3), ("allocate", 2), ("share", 0), ("free", 1), ("allocate", 4),
              ("free", 0), ("free", 0), ("allocate", 1), ("free", 1), ("free", 0), ("allocate", 5),
              ("free", 0), ("allocate", 2), ("allocate", 1), ("free", 0), ("free", 0)]
    keys = iter(range(10**6))
    for step, (op, arg) in enumerate(script):
        if op == "allocate":
            ids = ref.allocate(arg)
            assert impl.allocate(arg) == ids, f"step {step}"
            for b in ids:
                k = next(keys)
                if k % 3 == 2:
                    continue
                ref.cache_block((0, (k,)), b)
                impl.cache_block(k.to_bytes(16, "little"), b, 0, 1)
            held.append(ids)
        elif op == "share":
            ref.share(held[arg])
            impl.share(held[arg])
            held.append(list(held[arg]))
        else:
            ids = held.pop(arg)[::-1]
            ref.free(ids)
            impl.free(ids)
        b = next((b for b in ref.free_queue() if ref.is_cached(b)), None)
        if step % 3 == 2 and b is not None:
            ref.touch([b])
            impl.touch([b])
            held.append([b])
        same_cache(f"step {step} {op}", ref, impl)
        ref.check_invariants(held)
    for ids in held[::-1]:
        ref.free(ids[::-1])
        impl.free(ids[::-1])
    assert ref.reset_prefix_cache() is impl.reset_prefix_cache() is True
    same_cache("after the reset", ref, impl)


def test_bad_caching_pool_calls_are_rejected_and_change_nothing(rejects):
    pool = BlockPool(6, prefix_caching=True)
    pool.allocate(2)
    pool.cache_block(bytes(16), 1, 0, 4)
    pool.free([2, 1])  # queue: 3, 4, 5, 2, 1
    rejects(pool, ValueError, "touch: block 2 is not cached", pool.touch, [2])
    rejects(pool, ValueError, "touch: block 1 is listed twice in one call", pool.touch, [1, 1])
    rejects(pool, ValueError, "touch: block 0 is the null block", pool.touch, [0])
    rejects(pool, ValueError, "touch: block 6 is out of range", pool.touch, [6])
    rejects(pool, ValueError, "cache_block: block 2 is free \\(ref 0\\)", pool.cache_block, bytes(16), 2, 0, 4)
    rejects(pool, ValueError, "cache_block: block 0 is the null block", pool.cache_block, bytes(16), 0, 0, 4)
    rejects(pool, ValueError, "cannot allocate 6 blocks: only 5 are free", pool.allocate, 6)
    rejects(pool, ValueError, "free: double free of block 1", pool.free, [1])
    pool.allocate(1)
    assert pool.reset_prefix_cache() is False
    assert pool.cache_listing() == [(0, 4, [1])]
