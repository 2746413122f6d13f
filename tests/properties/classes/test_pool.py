"""A pool class under the lockstep (properties/classes/pool.py): what it returns is
checked on the way, and a wrong answer or an exception is the class's finding,
named by the method, never a crash of the harness."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from blocktable.properties.classes.pool import DrivenPool
from blocktable.properties.compare import Discrepancy

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "pool_class.py"
CONFIG = dict(num_blocks=6, null_block=True, prefix_caching=True, free_order="tail")


def example():
    spec = importlib.util.spec_from_file_location("pool_class_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ListPool


def driven(**methods):
    """The example class with some methods replaced."""
    cls = type("Edited", (example(),), methods)
    return DrivenPool.build(cls, "Edited", **CONFIG)


def test_the_example_reads_as_our_pool_does():
    pool = DrivenPool.build(example(), "ListPool", **CONFIG)
    assert pool.allocate(2) == [1, 2]
    pool.share([1])
    assert pool.ref[1] == 2 and pool.ref[[1, 2, 3]].tolist() == [2, 1, 0]
    assert np.asarray(pool.ref).dtype == np.int32 and np.asarray(pool.ref).tolist() == [0, 2, 1, 0, 0, 0]
    pool.cache_block(b"k", 2, 0, 4)
    assert pool.is_cached(2) and not pool.is_cached(1) and pool.first_cached(b"k") == 2
    assert pool.cache_listing() == [(0, 4, [2])]
    pool.unshare(1)
    assert pool.ref[1] == 1 and pool.num_free == 3 and pool.free_queue() == [3, 4, 5]
    with pytest.raises(ValueError, match="only a shared block is copied"):
        pool.unshare(1)


@pytest.mark.parametrize("methods, call, said", [
    ({"allocate": lambda self, n: [1]}, lambda p: p.allocate(2), "Edited.allocate(2) returned [1], expected a list "
                                                                  "of 2 block ids"),
    ({"num_free": lambda self: "3"}, lambda p: p.num_free, "returned '3', expected an int"),
    ({"lookup": lambda self, key: 1.5}, lambda p: p.first_cached(b"k"), "expected a block id or None"),
    ({"reset_prefix_cache": lambda self: 1}, lambda p: p.reset_prefix_cache(), "expected True or False"),
    ({"free_queue": lambda self: None}, lambda p: p.free_queue(), "expected a list of block ids, head first"),
    ({"cache_map": lambda self: [("k", 3)]}, lambda p: p.cache_listing(), "a list of (key, [block ids]) pairs"),
    ({"cache_map": lambda self: [("never given", [3])]}, lambda p: p.cache_listing(), "which the harness never "
                                                                                     "gave to cache()"),
    ({"touch": lambda self, ids: 1 / 0}, lambda p: p.share([1]), "Edited.touch([1]) raised ZeroDivisionError"),
    # The whole array is read in one pass: a finding still names its block.
    ({"ref": lambda self, b: 1 / (b - 4)}, lambda p: np.asarray(p.ref), "Edited.ref(4) raised ZeroDivisionError"),
    ({"ref": lambda self, b: 1.0 if b == 3 else 0}, lambda p: np.asarray(p.ref), "Edited.ref(3) returned 1.0, "
                                                                                "expected an int"),
    ({"ref": lambda self, b: np.int64(1) if b == 2 else True}, lambda p: np.asarray(p.ref), "Edited.ref(0) "
                                                                                           "returned True"),
    ({"ref": lambda self, b: "1"}, lambda p: p.ref[2], "Edited.ref(2) returned '1', expected an int"),
])
def test_a_wrong_answer_is_the_class_finding(methods, call, said):
    pool = driven(**methods)
    pool.inner.refs[1] = 1  # block 1 in use, so that a share is a valid call
    pool.inner.queue.remove(1)
    with pytest.raises(Discrepancy) as error:
        call(pool)
    assert said in str(error.value), str(error.value)


def test_every_ref_is_read_in_one_pass_as_block_by_block():
    pool = driven(ref=lambda self, b: np.int64(self.refs[b]))  # numpy ints are ids too
    pool.allocate(3)
    pool.share([2])
    assert np.asarray(pool.ref).tolist() == [pool.ref_of(b) for b in range(6)] == [0, 1, 2, 1, 0, 0]


def test_a_refusal_passes_through_to_be_compared_with_the_reference():
    pool = DrivenPool.build(example(), "ListPool", **CONFIG)
    with pytest.raises(ValueError, match="cannot allocate 9 blocks"):
        pool.allocate(9)


def test_a_constructor_that_raises_is_named_with_its_arguments():
    def broken(self, **config):
        raise RuntimeError("no GPU")

    with pytest.raises(Discrepancy, match=r"Broken\(num_blocks=6, null_block=True, prefix_caching=True, "
                                          r"free_order='tail'\) raised RuntimeError: no GPU"):
        DrivenPool.build(type("Broken", (), {"__init__": broken}), "Broken", **CONFIG)
