"""The data-oracle kernels (write, copy blocks, gather) against the reference's
paged-cache model, whole cache buffers compared."""

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from blocktable.oracle import DeviceCache
from blocktable.properties import strategies
from blocktable.reference import PagedCache, slot_mapping
from blocktable.reference.kvcache import POISON


def test_poison_agrees_with_the_reference(backend):
    from blocktable.oracle import poison_value

    assert poison_value() == POISON


@given(case=strategies.slot_cases(max_width=6), data=st.data())
def test_write_copy_gather_match_the_model(backend, case, data):
    cfg = case.config
    K, B = cfg.kv_block_size, cfg.kernel_block_size
    # Keep table ids small enough to land in a small cache (ids near 2**31-1 are
    # covered with slot_base below).
    table = (case.block_table % 8).astype(np.int32)
    num_slots = 8 * K
    sm = slot_mapping(case.query_start_loc, case.positions, table, case.max_num_tokens, **cfg.kwargs())
    values = np.arange(1, case.num_tokens + 1, dtype=np.int64) * 1000 + 7
    ref, dev = PagedCache(num_slots), DeviceCache(num_slots, backend=backend)
    ref.write(sm, values)
    dev.write(torch.from_numpy(sm).to(backend.device), torch.from_numpy(values).to(backend.device))
    assert np.array_equal(dev.values(), ref.data)

    srcs = data.draw(st.lists(st.integers(0, 3), max_size=3), label="sources")
    dsts = data.draw(st.lists(st.integers(4, 7), min_size=len(srcs), max_size=len(srcs), unique=True), label="dests")
    pairs = list(zip(srcs, dsts))
    ref.copy_blocks(pairs, K)
    dev.copy_blocks(pairs, K)
    assert np.array_equal(dev.values(), ref.data)

    rows_used = max(1, table.shape[0])
    M = data.draw(st.integers(0, 40), label="reads")
    rows = np.array(data.draw(st.lists(st.integers(0, rows_used - 1), min_size=M, max_size=M)), np.int32)
    positions = np.array(data.draw(st.lists(st.integers(0, 4 * K * cfg.cp_world_size), min_size=M, max_size=M)),
                         np.int64)
    if table.shape[0] == 0:
        table = np.zeros((1, table.shape[1]), np.int32)
    expected = np.array([ref.gather(table[r], p + 1, **cfg.kwargs())[p] for r, p in zip(rows, positions)],
                        dtype=np.int64)
    got = dev.gather(torch.from_numpy(table).to(backend.device), torch.from_numpy(rows).to(backend.device),
                     torch.from_numpy(positions).to(backend.device), **cfg.kwargs())
    assert np.array_equal(got.cpu().numpy(), expected.reshape(-1))


def test_slot_base_lets_ids_near_int32_max_index_a_small_cache(backend):
    K = B = 64
    block = 2**31 - 1
    table = torch.tensor([[block]], dtype=torch.int32, device=backend.device)
    dev = DeviceCache(K, slot_base=block * K, backend=backend)
    sm = torch.tensor([block * K + 5, -1], dtype=torch.int64, device=backend.device)
    dev.write(sm, torch.tensor([42, 43], dtype=torch.int64, device=backend.device))
    got = dev.gather(table, torch.zeros(1, dtype=torch.int32, device=backend.device),
                     torch.tensor([5], dtype=torch.int64, device=backend.device), kv_block_size=K, kernel_block_size=B)
    assert got.tolist() == [42]


def test_a_table_entry_outside_the_cache_reads_as_out_of_cache(backend):
    from blocktable.kernels.kv_oracle import OUT_OF_CACHE_VALUE

    dev = DeviceCache(32, backend=backend)
    table = torch.tensor([[1, 900]], dtype=torch.int32, device=backend.device)
    got = dev.gather(table, torch.zeros(2, dtype=torch.int32, device=backend.device),
                     torch.tensor([0, 16], dtype=torch.int64, device=backend.device), kv_block_size=16,
                     kernel_block_size=16)
    assert got.tolist() == [POISON, OUT_OF_CACHE_VALUE]


def test_bad_oracle_calls_are_rejected(backend, rejects):
    dev = DeviceCache(32, backend=backend)
    d = backend.device
    rejects(dev, ValueError, "write: slot 40 lies outside the cache \\[0, 32\\)", dev.write,
            torch.tensor([1, 40], dtype=torch.int64, device=d), torch.tensor([1, 2], dtype=torch.int64, device=d))
    rejects(dev, ValueError, "block 1 is both a source and a destination", dev.copy_blocks, [(0, 1), (1, 0)], 16)
    rejects(dev, ValueError, "a destination block lies outside the cache", dev.copy_blocks, [(0, 2)], 16)
    rejects(dev, TypeError, "values must be torch.int64", dev.write,
            torch.tensor([1], dtype=torch.int64, device=d), torch.tensor([1], dtype=torch.int32, device=d))
    with pytest.raises(ValueError, match="a row index lies outside the table's 1 rows"):
        dev.gather(torch.zeros((1, 2), dtype=torch.int32, device=d), torch.tensor([1], dtype=torch.int32, device=d),
                   torch.tensor([0], dtype=torch.int64, device=d), kv_block_size=16, kernel_block_size=16)
