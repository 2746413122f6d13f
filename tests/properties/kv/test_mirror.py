"""The device mirror of the reference's cache memory (properties/kv/mirror.py): the
cells it is sent are exactly those an entry or block holds, it stays equal to the
reference through a lockstep program, and its count of differing cells says what the
host comparison would (fp8 NaN codes equal only where the contract allows)."""

import numpy as np
import pytest
import torch

from blocktable.device import to_host, upload_arrays
from blocktable.properties.compare import Discrepancy
from blocktable.properties.kv.cache import cache_pair, flat_size
from blocktable.properties.kv.mirror import Mirror, block_cells, entry_cells
from blocktable.properties.lockstep.driver import Lockstep
from blocktable.properties.run.prepare import plugins_for
from blocktable.properties.world import GroupConfig, KVConfig, WorldConfig

KVS = [KVConfig(2, 4, "float16", "auto", "NHD", False, 0), KVConfig(1, 3, "bfloat16", "fp8_e4m3", "HND", True, 2),
       KVConfig(3, 2, "float32", "auto", "NHD", False, 1), KVConfig(2, 1, "float16", "auto", "HND", False, 3)]


@pytest.mark.parametrize("kv", KVS, ids=lambda kv: kv.describe())
def test_cells_are_those_of_the_entries_and_blocks(kv):
    blocks, Bk = 5, 4
    flat = np.arange(flat_size(kv, blocks, Bk), dtype=np.int64)  # each cell holds its own index
    pair = cache_pair(flat, kv, blocks, Bk)
    block, offset = np.array([4, 0, 2, 4]), np.array([3, 0, 1, 0])
    for view in (pair.key, pair.value):
        entries = view[block, offset] if kv.layout == "NHD" else view[block, :, offset]
        assert np.array_equal(entry_cells(view, flat, kv.layout, block, offset), entries.reshape(-1))
        assert np.array_equal(block_cells(view, flat, np.array([3, 1])), view[[3, 1]].reshape(-1))
    assert len(entry_cells(pair.key, flat, kv.layout, np.zeros(0, np.int64), np.zeros(0, np.int64))) == 0


def bits_of(host: np.ndarray) -> np.ndarray:
    return host.view({1: np.uint8, 2: np.int16, 4: np.int32}[host.itemsize])


def test_the_count_is_of_differing_bits_and_fp8_nans_are_equal_only_in_elements(backend):
    host = np.array([0x7F, 0x7F, 0xFF, 0x00, 0x01, 0x7F], dtype=np.uint8)
    elements = np.array([True, True, True, True, True, False])
    mirror = Mirror(host, backend, elements)
    same = torch.from_numpy(host.copy()).to(backend.device)
    assert int(mirror.count_differing(same, strict_nan=False)[0]) == 0
    # 0x7F -> 0xFF twice (an element, then a guard cell), 0x00 -> 0x80 (-0 is not +0)
    other = torch.from_numpy(np.array([0xFF, 0x7F, 0xFF, 0x80, 0x01, 0xFF], dtype=np.uint8)).to(backend.device)
    assert int(mirror.count_differing(other, strict_nan=False)[0]) == 2
    assert int(mirror.count_differing(other, strict_nan=True)[0]) == 3
    plain = Mirror(np.array([0.0, -0.0, np.nan], dtype=np.float16), backend)
    flipped = torch.tensor([-0.0, -0.0, np.nan], dtype=torch.float16, device=backend.device)
    assert int(plain.count_differing(flipped, strict_nan=False)[0]) == 1  # NaN bits equal, -0 differs


def test_changes_applied_write_the_hosts_bits_at_those_cells(backend):
    host = np.array([1.5, -2.0, 3.0, np.inf], dtype=np.float32)
    mirror = Mirror(host, backend)
    host[[1, 3]] = [np.float32(-0.0), np.float32(7.25)]
    host[2] = 9.0  # changed but not sent: the mirror keeps the old bits
    changes = mirror.changes(np.array([3, 1, 3]))
    assert changes is not None and changes.shape == (2, 2)  # each cell once
    assert mirror.changes(np.zeros(0, dtype=np.int64)) is None
    (sent,) = upload_arrays([changes], backend)
    mirror.apply(sent)
    assert np.array_equal(to_host([mirror.expected])[0], bits_of(np.array([1.5, -0.0, 3.0, 7.25], np.float32)))


PROGRAM = [{"op": "add"}, {"op": "step", "query": [30]}, {"op": "fork", "parent": 0},
           {"op": "step", "query": [5, 5]}, {"op": "step", "query": [1, 40]}, {"op": "add"},
           {"op": "step", "query": [3, 1, 17]}]


@pytest.mark.parametrize("kv", KVS, ids=lambda kv: kv.describe())
def test_the_mirror_equals_the_reference_after_every_step(backend, kv):
    """Copy-on-write, scratch copies, prefills and decodes under DCP with a hybrid and a
    replicated group: after each step each group's mirror holds the reference's memory,
    bit for bit (the cells sent are all the reference changed)."""
    world = WorldConfig(groups=(GroupConfig(32, 16, True, 8), GroupConfig(8, 4, False)), cp_world_size=2,
                        num_blocks=20, max_num_reqs=3, max_model_len=200, max_num_batched_tokens=40, kv=kv)
    run = Lockstep(world, plugins_for("triton", {}, backend), backend)
    for step in PROGRAM:
        run.apply(step)
        for g, mirror in enumerate(run.kv.mirrors):
            assert np.array_equal(to_host([mirror.expected])[0], bits_of(run.kv.ref[g].flat)), (step, g)
    assert run.events["KV blocks copied on write"] and run.steps_with_tokens == 4


def test_a_write_into_the_harness_copy_is_told_as_a_write_outside_the_caches(backend):
    """Only the harness writes the mirror, from the reference: when the device counts a
    difference and the caches equal the reference on the host, something wrote into the
    mirror itself (a kernel far outside its caches), and the report says so."""
    world = WorldConfig(groups=(GroupConfig(16, 16),), num_blocks=8, max_num_reqs=2, max_model_len=64,
                        max_num_batched_tokens=16, kv=KVS[0])
    run = Lockstep(world, plugins_for("triton", {}, backend), backend)
    run.apply({"op": "add"})
    run.apply({"op": "step", "query": [3]})
    run.kv.mirrors[0].expected[5] ^= 1  # a guard cell no step writes
    with pytest.raises(Discrepancy, match=r"KV cache: memory outside the caches was written: the harness's own "
                                          r"device copy .* changed in 1 cells, first cell -59"):
        run.apply({"op": "step", "query": [1]})
