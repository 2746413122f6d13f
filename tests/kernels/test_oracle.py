"""The data-oracle kernels (write, copy blocks, gather) against the reference's
paged-cache model, one model per DCP rank, whole cache buffers compared."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from blocktable.oracle import DeviceCache, Reads, out_of_cache_value, poison_value
from blocktable.properties.slot import draw as strategies
from blocktable.reference import PagedCache, slot_mapping
from blocktable.reference.oracle import POISON


def test_poison_agrees_with_the_reference():
    assert poison_value() == POISON


ENGINES = pytest.mark.parametrize("engine", ["triton", "torch"])


@ENGINES
@given(case=strategies.slot_cases(max_width=6), data=st.data())
def test_write_copy_gather_match_the_model_on_every_rank(backend, engine, case, data):
    cfg = case.config
    K, B, W = cfg.kv_block_size, cfg.kernel_block_size, cfg.cp_world_size
    kw = dict(kv_block_size=K, kernel_block_size=B, cp_world_size=W, cp_interleave=cfg.cp_interleave)
    d = backend.device
    # Table ids modulo 8 land in an 8-block cache (huge ids are covered with slot_base below).
    table = (case.block_table % 8).astype(np.int32)
    if table.shape[0] == 0:
        table = np.zeros((1, table.shape[1]), np.int32)
    num_slots = 8 * K
    maps = [slot_mapping(case.query_start_loc, case.positions, table, case.max_num_tokens, cp_rank=r, **kw)
            for r in range(W)]
    values = np.arange(1, case.num_tokens + 1, dtype=np.int64) * 1000 + 7
    models = [PagedCache(num_slots) for _ in range(W)]
    dev = DeviceCache(num_slots, ranks=W, backend=backend, engine=engine)
    stacked = torch.from_numpy(np.stack(maps)).to(d)
    twice = [len(set(m[m >= 0].tolist())) < int((m >= 0).sum()) for m in maps]
    if any(twice):
        # Two tokens in one slot: both sides refuse (a GPU would race), nothing written.
        for model, m, dup in zip(models, maps, twice):
            if dup:
                with pytest.raises(ValueError, match="written by more than one token"):
                    model.write(m, values)
        with pytest.raises(ValueError, match="written by more than one token"):
            dev.write(stacked, torch.from_numpy(values).to(d))
        assert (dev.values() == POISON).all()
        return
    for model, m in zip(models, maps):
        model.write(m, values)
    dev.write(stacked, torch.from_numpy(values).to(d))
    assert np.array_equal(dev.values(), np.stack([m.data for m in models]))
    # The same write unchecked (the lockstep's way, which compares the slots itself).
    unchecked = DeviceCache(num_slots, ranks=W, backend=backend, engine=engine)
    unchecked.write(stacked, torch.from_numpy(values).to(d), check=False)
    assert np.array_equal(unchecked.values(), dev.values())

    sources = data.draw(st.lists(st.integers(0, 3), max_size=3), label="sources")
    dests = data.draw(st.lists(st.integers(4, 7), min_size=len(sources), max_size=len(sources), unique=True),
                      label="destinations")
    pairs = list(zip(sources, dests))
    for model in models:
        model.copy_blocks(pairs, K)
    dev.copy_blocks(pairs, K)
    assert np.array_equal(dev.values(), np.stack([m.data for m in models]))

    M = data.draw(st.integers(0, 40), label="reads")
    rows = np.array(data.draw(st.lists(st.integers(0, table.shape[0] - 1), min_size=M, max_size=M)), np.int32)
    positions = np.array(data.draw(st.lists(st.integers(0, 4 * K * W), min_size=M, max_size=M)), np.int64)
    expected = np.array([[model.gather(table[r], p + 1, cp_rank=rank, **kw)[p] for r, p in zip(rows, positions)]
                         for rank, model in enumerate(models)], dtype=np.int64).reshape(W, M)
    got = dev.gather(torch.from_numpy(table).to(d), torch.from_numpy(rows).to(d), torch.from_numpy(positions).to(d),
                     **kw)
    assert np.array_equal(got.cpu().numpy(), expected)
    from_host = dev.gather(torch.from_numpy(table).to(d), rows, positions, **kw)  # checked on the host, then sent
    assert np.array_equal(from_host.cpu().numpy(), expected)


@ENGINES
def test_slot_base_lets_ids_near_int32_max_index_a_small_cache(backend, engine):
    K = B = 64
    block = 2**31 - 1
    d = backend.device
    table = torch.tensor([[block]], dtype=torch.int32, device=d)
    dev = DeviceCache(K, slot_base=block * K, backend=backend, engine=engine)
    dev.write(torch.tensor([block * K + 5, -1], dtype=torch.int64, device=d),
              torch.tensor([42, 43], dtype=torch.int64, device=d))
    got = dev.gather(table, torch.zeros(1, dtype=torch.int32, device=d), torch.tensor([5], dtype=torch.int64, device=d),
                     kv_block_size=K, kernel_block_size=B)
    assert got.tolist() == [[42]]


@ENGINES
@pytest.mark.parametrize("slot_base", [0, 5 * 16])
def test_an_unchecked_write_skips_every_slot_outside_its_ranks_cache(backend, engine, slot_base):
    # Unmasked, rank 0's slot just past its cache would land in rank 1's first slot,
    # and rank 1's slot just below its cache in rank 0's last: the whole buffer shows it.
    d = backend.device
    dev = DeviceCache(32, slot_base=slot_base, ranks=2, backend=backend, engine=engine)
    maps = torch.tensor([[slot_base + 32, slot_base + 3, -1, slot_base + 2**40],
                         [slot_base - 1, -1, slot_base + 31, -2**62]], dtype=torch.int64, device=d)
    dev.write(maps, torch.tensor([10, 11, 12, 13], dtype=torch.int64, device=d), check=False)
    expected = np.full((2, 32), POISON, dtype=np.int64)
    expected[0, 3], expected[1, 31] = 11, 12
    assert np.array_equal(dev.values(), expected)
    with pytest.raises(ValueError, match=f"write: slot {slot_base + 32} lies outside the cache"):
        dev.write(maps, torch.tensor([10, 11, 12, 13], dtype=torch.int64, device=d))


@ENGINES
def test_a_table_entry_outside_the_cache_reads_as_out_of_cache(backend, engine):
    d = backend.device
    dev = DeviceCache(32, backend=backend, engine=engine)
    table = torch.tensor([[1, 900]], dtype=torch.int32, device=d)
    got = dev.gather(table, torch.zeros(2, dtype=torch.int32, device=d),
                     torch.tensor([0, 16], dtype=torch.int64, device=d), kv_block_size=16, kernel_block_size=16)
    assert got.tolist() == [[POISON, out_of_cache_value()]]


@ENGINES
def test_bad_oracle_calls_are_rejected(backend, engine, rejects):
    d = backend.device
    dev = DeviceCache(32, ranks=2, backend=backend, engine=engine)
    two = torch.tensor([[1, 2], [3, 40]], dtype=torch.int64, device=d)
    rejects(dev, ValueError, "write: slot 40 lies outside the cache \\[0, 32\\)", dev.write, two,
            torch.tensor([1, 2], dtype=torch.int64, device=d))
    rejects(dev, ValueError, "1 slot mappings for 2 ranks", dev.write, two[0],
            torch.tensor([1, 2], dtype=torch.int64, device=d))
    rejects(dev, ValueError, "block 1 is both a source and a destination", dev.copy_blocks, [(0, 1), (1, 0)], 16)
    rejects(dev, ValueError, "a destination block lies outside the cache", dev.copy_blocks, [(0, 2)], 16)
    rejects(dev, TypeError, "values must be torch.int64", dev.write, two, two[0].int())
    with pytest.raises(ValueError, match="a row index lies outside the table's 1 rows"):
        dev.gather(torch.zeros((1, 2), dtype=torch.int32, device=d), torch.tensor([1], dtype=torch.int32, device=d),
                   torch.tensor([0], dtype=torch.int64, device=d), kv_block_size=16, kernel_block_size=16,
                   cp_world_size=2)
    table = torch.zeros((1, 2), dtype=torch.int32, device=d)
    with pytest.raises(ValueError, match="a row index lies outside the table's 1 rows"):
        dev.gather(table, np.array([1], np.int32), np.array([0], np.int64), kv_block_size=16, kernel_block_size=16,
                   cp_world_size=2)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        dev.gather(table, np.array([0], np.int32), np.array([-1], np.int64), kv_block_size=16, kernel_block_size=16,
                   cp_world_size=2)
    with pytest.raises(TypeError, match="rows must be a 1-D int32 array, got int64"):
        dev.gather(table, np.array([0], np.int64), np.array([0], np.int64), kv_block_size=16, kernel_block_size=16,
                   cp_world_size=2)
    with pytest.raises(ValueError, match="a cache of 2 ranks read as 1 DCP ranks"):
        dev.gather(torch.zeros((1, 2), dtype=torch.int32, device=d), torch.tensor([0], dtype=torch.int32, device=d),
                   torch.tensor([0], dtype=torch.int64, device=d), kv_block_size=16, kernel_block_size=16)


def test_unknown_engine_is_rejected(backend):
    with pytest.raises(ValueError, match="oracle engine must be one of triton, torch, got 'numba'"):
        DeviceCache(8, backend=backend, engine="numba")


@ENGINES
def test_reads_sent_once_serve_several_caches(backend, engine):
    """A lockstep step sends its read list once and every group reads it: each read
    equals that group's own gather from host arrays."""
    d = backend.device
    rows, positions = np.array([0, 1, 1], np.int32), np.array([0, 3, 9], np.int64)
    reads = Reads.send(rows, positions, backend)
    for K, W in ((4, 1), (8, 2)):
        dev = DeviceCache(64, ranks=W, backend=backend, engine=engine)
        dev.data.copy_(torch.arange(64 * W, dtype=torch.int64).reshape(W, 64))
        table = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32, device=d)
        kw = dict(kv_block_size=K, kernel_block_size=K, cp_world_size=W)
        got = dev.read(table, reads, **kw).cpu().numpy()
        assert np.array_equal(got, dev.gather(table, rows, positions, **kw).cpu().numpy())
        assert ((got != POISON).sum(axis=0) == 1).all()  # every position held by one rank: a real read
        with pytest.raises(ValueError, match="a row index lies outside the table's 1 rows"):
            dev.read(table[:1], reads, **kw)


def test_bad_reads_are_refused_before_they_are_sent(backend):
    with pytest.raises(ValueError, match="row indices must be >= 0"):
        Reads.send(np.array([-1], np.int32), np.array([0], np.int64), backend)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        Reads.send(np.array([0], np.int32), np.array([-5], np.int64), backend)
    with pytest.raises(ValueError, match="2 rows for 1 positions"):
        Reads.send(np.array([0, 0], np.int32), np.array([0], np.int64), backend)
    with pytest.raises(TypeError, match="positions must be a 1-D int64 array, got int32"):
        Reads.send(np.array([0], np.int32), np.array([0], np.int32), backend)


def test_reads_sent_with_other_arrays_read_as_reads_sent_alone(backend):
    """A lockstep step sends its reads in the upload of its values (Reads.packed, then
    Reads.received on the device copy): the same reads as Reads.send makes, and a
    device copy of the wrong shape or dtype is refused."""
    from blocktable.device import upload_arrays

    rows, positions = np.array([2, 0, 1], np.int32), np.array([7, 0, 5], np.int64)
    values = np.arange(5, dtype=np.int64)
    _, sent = upload_arrays([values, Reads.packed(rows, positions)], backend)
    together, alone = Reads.received(rows, positions, sent), Reads.send(rows, positions, backend)
    for a, b in ((together.rows_device, alone.rows_device), (together.positions_device, alone.positions_device)):
        assert a.dtype == b.dtype == torch.int64
        assert np.array_equal(a.cpu().numpy(), b.cpu().numpy())
    assert np.array_equal(together.rows_device.cpu().numpy(), [2, 0, 1])
    assert np.array_equal(together.positions_device.cpu().numpy(), [7, 0, 5])
    with pytest.raises(ValueError, match=r"sent as torch.int64 \(5,\), not int64 \(6,\)"):
        Reads.received(rows, positions, sent[:5])
    with pytest.raises(ValueError, match=r"sent as torch.int32 \(6,\)"):
        Reads.received(rows, positions, sent.to(torch.int32))
    with pytest.raises(ValueError, match="row indices must be >= 0"):
        Reads.packed(np.array([-1], np.int32), np.array([0], np.int64))
