"""GPU only: rows whose offsets pass 2**31 entries (docs/contract.md §10.4, vLLM #57030).

Each V2 kernel gets its rows (and the gather its inp too) as the interior of a
buffer of 2**16 + 1 rows with a row stride of 2**15 + 8 entries, so that the last
row starts past entry 2**31 and `r * stride` wraps in int32. The kernel writes or
reads that row; what it leaves is compared whole with the reference
(reference/v2.py) over every row, and every entry outside the interior must still
hold the fill. Each buffer is 8.6 GB: a test that lacks the memory skips and says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from blocktable import plugin
from blocktable.reference.v2 import BlockTables

pytestmark = pytest.mark.gpu

ROWS = 2**16 + 1
STRIDE = 2**15 + 8  # (ROWS - 1) * STRIDE = 2**31 + 2**19
WIDTH = 8
LEAD = 4  # the interior starts 4 entries into each row: 16-byte aligned, as vLLM's kernels assume
FILL = 7
LAST = ROWS - 1
BUFFER_BYTES = ROWS * STRIDE * 4
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SPECS = {"append": ["triton", "torch", f"{EXAMPLES / 'torch_v2_append.py'}:append"],
         "gather": ["triton", "torch", f"{EXAMPLES / 'torch_v2_gather.py'}:gather"],
         "slots": ["triton", "torch", f"{EXAMPLES / 'torch_v2_slots.py'}:slot_mappings"]}


def spec_id(spec: str) -> str:
    """A plug-in's file by name alone: a test id must not depend on where the checkout lies."""
    return Path(spec).name


def need_memory(buffers: int) -> None:
    free, _ = torch.cuda.mem_get_info()
    need = buffers * BUFFER_BYTES + 3 * 2**30  # and the comparisons: one byte an entry
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory for rows past entry 2**31; "
                    f"{free / 2**30:.1f} GiB free")


def big() -> tuple[torch.Tensor, torch.Tensor]:
    """(the buffer, its [ROWS, WIDTH] interior) with every entry FILL."""
    buffer = torch.full((ROWS, STRIDE), FILL, dtype=torch.int32, device="cuda")
    rows = buffer[:, LEAD:LEAD + WIDTH]
    assert rows.stride(0) * LAST + rows.storage_offset() >= 2**31
    return buffer, rows


def untouched_outside(buffer: torch.Tensor, interior: torch.Tensor) -> bool:
    interior.fill_(FILL)
    return bool((buffer == FILL).all())


def reference(max_num_batched_tokens: int = 1) -> BlockTables:
    ref = BlockTables([16], ROWS, max_num_batched_tokens, [WIDTH])
    ref.rows[0][...] = FILL
    ref.inp[0][...] = FILL
    return ref


@pytest.fixture(autouse=True)
def _free():
    yield
    torch.cuda.empty_cache()


@pytest.mark.parametrize("spec", SPECS["append"], ids=spec_id)
def test_append_writes_the_last_row(spec):
    need_memory(1)
    kernel = plugin.load_v2("append", spec)
    buffer, rows = big()
    ref = reference()
    top = 2**31 - 1
    ref.append_block_ids(1, [[top, 0, 5]], True)
    ref.append_block_ids(LAST, [[top - i for i in range(WIDTH)]], True)
    staged = list(ref.staged)
    cnt = torch.from_numpy(ref.cnt.copy()).cuda()
    ref.apply_staged_writes()
    cu = np.cumsum([0] + [len(ids) for *_, ids in staged])
    args = [torch.tensor(values, dtype=torch.int32, device="cuda") for values in (
        [w[0] for w in staged], [w[1] for w in staged], [w[2] for w in staged],
        [i for w in staged for i in w[3]], cu.tolist())]
    cnt_dev = torch.zeros((1, ROWS), dtype=torch.int32, device="cuda")
    kernel([rows], cnt_dev, cnt, *args)
    torch.cuda.synchronize()
    assert np.array_equal(rows.cpu().numpy(), ref.rows[0])
    assert np.array_equal(cnt_dev.cpu().numpy(), ref.cnt_dev)
    assert untouched_outside(buffer, rows)


@pytest.mark.parametrize("spec", SPECS["gather"], ids=spec_id)
def test_gather_reads_and_writes_rows_past_entry_2_31(spec):
    need_memory(2)
    kernel = plugin.load_v2("gather", spec)
    source, rows = big()
    target, inp = big()
    ids = np.arange(ROWS * WIDTH, dtype=np.int32).reshape(ROWS, WIDTH)
    counts = (np.arange(ROWS) % (WIDTH + 1)).astype(np.int32).reshape(1, ROWS)
    rows.copy_(torch.from_numpy(ids))
    ref = reference()
    ref.rows[0][...] = ids
    ref.cnt_dev[...] = counts
    idx = np.arange(ROWS - 1, -1, -1, dtype=np.int64)  # batch position b reads slot ROWS-1-b: both ends far
    ref.gather_block_tables(idx, ROWS)
    kernel([rows], torch.from_numpy(counts).cuda(), [inp], torch.from_numpy(idx).cuda(), ROWS)
    torch.cuda.synchronize()
    assert np.array_equal(inp.cpu().numpy(), ref.inp[0])
    assert np.array_equal(rows.cpu().numpy(), ref.rows[0])
    assert untouched_outside(target, inp)
    assert untouched_outside(source, rows)


@pytest.mark.parametrize("spec", SPECS["slots"], ids=spec_id)
def test_slot_mappings_read_the_last_row(spec):
    need_memory(1)
    kernel = plugin.load_v2("slots", spec)
    buffer, rows = big()
    T = WIDTH * 16 + 5  # the last five positions lie past the row: -1
    tmax = T + 3
    top = np.array([2**31 - 1 - i for i in range(WIDTH)], dtype=np.int32)
    rows[LAST].copy_(torch.from_numpy(top))
    ref = reference(tmax)
    ref.rows[0][LAST] = top
    ref.slots[...] = -7
    idx = np.array([LAST], dtype=np.int32)
    qsl = np.array([0, T], dtype=np.int32)
    positions = np.arange(T, dtype=np.int64)
    ref.compute_slot_mappings(idx, qsl, positions, T)
    slots = torch.full((1, tmax), -7, dtype=torch.int64, device="cuda")
    kernel([rows], *(torch.from_numpy(a).cuda() for a in (idx, qsl, positions)), slots, T,
           kv_block_sizes=[16], kernel_block_sizes=[16], sharded=[True], enabled=[True], cp_world_size=1,
           cp_rank=0, cp_interleave=1)
    torch.cuda.synchronize()
    assert np.array_equal(slots.cpu().numpy(), ref.slots)
    assert np.array_equal(rows.cpu().numpy(), ref.rows[0])
    assert untouched_outside(buffer, rows)
