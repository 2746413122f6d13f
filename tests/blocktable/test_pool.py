"""The ring-buffer pool hands out the same ids as the reference's FIFO list."""

import pytest

from blocktable.pool import BlockPool
from blocktable.properties.compare import assert_pool_equal
from blocktable.reference import BlockPool as ReferencePool


@pytest.mark.parametrize("null_block", [True, False])
def test_scripted_pool_matches_the_reference(null_block):
    ref, impl = ReferencePool(9, null_block), BlockPool(9, null_block)
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
        assert_pool_equal(f"step {step} {op}", ref, impl)
        ref.check_invariants(held)


def test_the_ring_wraps_around_many_times():
    ref, impl = ReferencePool(5), BlockPool(5)
    for round in range(20):
        a = ref.allocate(3)
        assert impl.allocate(3) == a
        ref.free([a[1]])
        impl.free([a[1]])
        ref.free([a[2], a[0]])
        impl.free([a[2], a[0]])
        assert_pool_equal(f"round {round}", ref, impl)


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
