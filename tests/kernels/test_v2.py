"""The three V2 kernels of docs/contract.md §10.10 called directly, on random inputs: our
Triton kernels against the torch-native twins and a per-entry loop written here from
§10.4, §10.5 and §10.7, whole buffers compared bit for bit.

Every table and output is the interior of a larger buffer filled with poison (so row
strides exceed the widths, and a write outside the interior, or a missed entry,
shows); outputs start as poison or stale random values."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from blocktable.v2 import TRITON_KERNELS
from blocktable.v2_torch import TORCH_KERNELS

POISON32 = 0x5A5A5A5A
POISON64 = 0x5A5A5A5A5A5A5A5A
INT32_MAX = 2**31 - 1
IMPLEMENTATIONS = {"triton": TRITON_KERNELS, "torch": TORCH_KERNELS}
SEEDS = range(6)


def guarded(values: np.ndarray, device, poison: int, pad=(1, 2, 1, 3)) -> tuple[torch.Tensor, torch.Tensor]:
    """(whole buffer, interior view holding `values`): `pad` rows above, below and
    columns left, right of poison."""
    top, bottom, left, right = pad
    rows, cols = values.shape
    buf = np.full((rows + top + bottom, cols + left + right), poison, dtype=values.dtype)
    buf[top:top + rows, left:left + cols] = values
    whole = torch.from_numpy(buf).to(device)
    return whole, whole[top:top + rows, left:left + cols]


@dataclass
class World:
    K: list[int]
    B: list[int]
    widths: list[int]
    sharded: list[bool]
    enabled: list[bool]
    Rmax: int
    W: int
    R: int
    I: int

    @property
    def G(self) -> int:
        return len(self.K)

    def kwargs(self) -> dict:
        return {"kv_block_sizes": self.K, "kernel_block_sizes": self.B, "sharded": self.sharded,
                "enabled": self.enabled, "cp_world_size": self.W, "cp_rank": self.R, "cp_interleave": self.I}


SIZES = [(16, 16), (32, 16), (64, 16), (16, 4), (8, 8), (128, 32), (32, 8), (64, 64)]


def random_world(rng, G: int | None = None, W: int | None = None, max_blocks: int = 6) -> World:
    G = int(rng.integers(1, 5)) if G is None else G
    pairs = [SIZES[i] for i in rng.integers(0, len(SIZES), G)]
    K, B = [k for k, _ in pairs], [b for _, b in pairs]
    widths = [int(rng.integers(1, max_blocks + 1)) * (k // b) for k, b in pairs]
    W = int(rng.choice([1, 2, 4])) if W is None else W
    sharded = [bool(s) for s in rng.random(G) < 0.7]
    # I must divide every sharded group's K; draw it from those, often larger than B.
    sharded_K = [k for k, s in zip(K, sharded) if s] or [1]
    choices = [i for i in (1, 2, 4, 8, 16, 32) if all(k % i == 0 for k in sharded_K)]
    I = int(rng.choice(choices)) if W > 1 else 1
    enabled = [bool(e) for e in rng.random(G) < 0.85]
    return World(K, B, widths, sharded, enabled, int(rng.integers(1, 9)), W, int(rng.integers(W)), I)


def random_ids(rng, shape) -> np.ndarray:
    """Block ids, a quarter of them within 64 of 2**31 - 1."""
    ids = rng.integers(0, 5000, size=shape, dtype=np.int64)
    near = rng.random(shape) < 0.25
    ids[near] = INT32_MAX - rng.integers(0, 64, size=int(near.sum()))
    return ids.astype(np.int32)


def tables(rng, world: World, device):
    """Guarded rows filled with random ids to the full width (stale entries too)."""
    host = [random_ids(rng, (world.Rmax, w)) for w in world.widths]
    pairs = [guarded(h, device, POISON32, pad=(1, 2, 1, 1 + g)) for g, h in enumerate(host)]
    return host, [whole for whole, _ in pairs], [view for _, view in pairs]


def assert_same(got: list[torch.Tensor], expected: list[np.ndarray], what: str) -> None:
    for g, (t, e) in enumerate(zip(got, expected)):
        a = t.cpu().numpy()
        assert a.dtype == e.dtype and np.array_equal(a, e), f"{what} {g} differs at {np.argwhere(a != e)[:5]}"


# ---- append -------------------------------------------------------------------------------

def run_append(kernels, rng, world, device, writes):
    host, whole, rows = tables(rng, world, device)
    lengths = [n for _, _, _, n in writes]
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = random_ids(rng, (int(cu[-1]),))
    cnt = np.stack([rng.integers(0, w + 1, world.Rmax) for w in world.widths]).astype(np.int32)
    dev_whole, cnt_dev = guarded(rng.integers(0, 99, (world.G, world.Rmax)).astype(np.int32), device, POISON32)
    flat = [torch.tensor([w[k] for w in writes], dtype=torch.int32, device=device) for k in range(3)]
    kernels.append(rows, cnt_dev, torch.from_numpy(cnt).to(device), *flat, torch.from_numpy(ids).to(device),
                   torch.from_numpy(cu).to(device))
    expected = []  # §10.4: the writes in order over the rows as they were
    for g, h in enumerate(host):
        buf = np.full(whole[g].shape, POISON32, dtype=np.int32)
        buf[1:1 + world.Rmax, 1:1 + world.widths[g]] = h
        expected.append(buf)
    for i, (g, r, start, n) in enumerate(writes):
        expected[g][1 + r, 1 + start:1 + start + n] = ids[cu[i]:cu[i + 1]]
    assert_same(whole, expected, "rows of group")
    cnt_expected = np.full(dev_whole.shape, POISON32, dtype=np.int32)
    cnt_expected[1:1 + world.G, 1:1 + world.Rmax] = cnt
    assert_same([dev_whole], [cnt_expected], "cnt_dev")


def random_writes(rng, world, count, fill_rows=False):
    writes = []
    for _ in range(count):
        g = int(rng.integers(world.G))
        r = int(rng.integers(world.Rmax))
        w = world.widths[g]
        if fill_rows or rng.random() < 0.2:
            start, n = 0, w  # a row filled to its width
        else:
            start = int(rng.integers(0, w))
            n = int(rng.integers(0, w - start + 1))
        writes.append((g, r, start, n))
    return writes


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("seed", SEEDS)
def test_append_random_writes_later_wins(backend, impl, seed):
    rng = np.random.default_rng(seed)
    world = random_world(rng)
    world.Rmax = min(world.Rmax, 3)  # few rows: many writes overlap
    run_append(IMPLEMENTATIONS[impl], rng, world, backend.device, random_writes(rng, world, int(rng.integers(0, 14))))


@pytest.fixture
def programs_last_first(backend, monkeypatch):
    """Under the interpreter, programs run in order of their ids, so an earlier write
    loses to a later one even without the kernel's overlap test. This runs them last
    first (program k of n sees id n-1-k), the order in which that test matters."""
    if not backend.interpreted:
        pytest.skip("program order is the GPU's to choose")
    from triton.runtime.interpreter import interpreter_builder as builder

    set_grid_idx = builder.set_grid_idx
    monkeypatch.setattr(builder, "set_grid_idx",
                        lambda x, y, z: set_grid_idx(builder.grid_dim[0] - 1 - x, y, z))


@pytest.mark.parametrize("seed", SEEDS)
def test_append_later_wins_when_programs_run_last_first(backend, programs_last_first, seed):
    rng = np.random.default_rng(seed)
    world = random_world(rng)
    world.Rmax = min(world.Rmax, 2)
    run_append(TRITON_KERNELS, rng, world, backend.device, random_writes(rng, world, int(rng.integers(4, 14))))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_append_no_writes_copies_the_counts_only(backend, impl):
    rng = np.random.default_rng(7)
    run_append(IMPLEMENTATIONS[impl], rng, random_world(rng, G=3), backend.device, [])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_append_long_rows_and_more_writes_than_a_tile(backend, impl):
    """A row of 1500 entries (two column tiles) overwritten twice, and 1100 writes to
    distinct rows between, so that a later write to the same row lies more than a
    1024-write tile ahead of an earlier one."""
    rng = np.random.default_rng(11)
    world = World([16, 16], [16, 16], [1500, 4], [True, True], [True, True], 1100, 1, 0, 1)
    writes = [(0, 1, 0, 1500), (0, 1, 200, 1300), (0, 0, 3, 1100)]
    writes += [(1, i, i % 4, 1) for i in range(1100)]
    writes += [(0, 1, 1499, 1), (1, 0, 0, 4), (1, 1099, 0, 2)]
    run_append(IMPLEMENTATIONS[impl], rng, world, backend.device, writes)


# ---- gather -------------------------------------------------------------------------------

def random_idx(rng, Rmax: int, N: int) -> np.ndarray:
    """A permuted selection of rows with -1 dummies and duplicates."""
    idx = rng.permutation(np.concatenate([np.arange(Rmax), rng.integers(0, Rmax, Rmax)]))[:N]
    idx[rng.random(N) < 0.2] = -1
    return idx


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("seed", SEEDS)
def test_gather_random_batches(backend, impl, seed):
    rng = np.random.default_rng(100 + seed)
    world = random_world(rng)
    device = backend.device
    host, whole, rows = tables(rng, world, device)
    cnt = np.stack([rng.integers(0, w + 1, world.Rmax) for w in world.widths]).astype(np.int32)
    npad = int(rng.integers(0, world.Rmax + 1))
    N = int(rng.integers(0, npad + 1))
    idx = random_idx(rng, world.Rmax, N)
    stale = [random_ids(rng, (world.Rmax, w)) for w in world.widths]
    pairs = [guarded(s, device, POISON32, pad=(2, 1, 3, 1)) for s in stale]
    _, cnt_dev = guarded(cnt, device, POISON32)
    dtype = torch.int64 if seed % 2 else torch.int32
    IMPLEMENTATIONS[impl].gather(rows, cnt_dev, [v for _, v in pairs], torch.tensor(idx, dtype=dtype, device=device),
                                 npad)
    expected = []
    for g, (s, (w_inp, _)) in enumerate(zip(stale, pairs)):
        inp = s.copy()
        for b in range(npad):
            r = int(idx[b]) if b < N else -1
            if r < 0:
                inp[b] = 0
            else:
                inp[b, :cnt[g, r]] = host[g][r, :cnt[g, r]]
        buf = np.full(w_inp.shape, POISON32, dtype=np.int32)
        buf[2:2 + world.Rmax, 3:3 + world.widths[g]] = inp
        expected.append(buf)
    assert_same([w for w, _ in pairs], expected, "inp of group")
    rows_expected = []
    for g, h in enumerate(host):
        buf = np.full(whole[g].shape, POISON32, dtype=np.int32)
        buf[1:1 + world.Rmax, 1:1 + world.widths[g]] = h
        rows_expected.append(buf)
    assert_same(whole, rows_expected, "rows (read only) of group")


# ---- slot mappings --------------------------------------------------------------------------

def expected_slots(world: World, host, idx, qsl, positions, Tmax) -> np.ndarray:
    out = np.full((world.G, Tmax), -1, dtype=np.int64)
    N = len(idx)
    for g in range(world.G):
        if not world.enabled[g]:
            continue
        K, B, W, R, I = world.K[g], world.B[g], world.W, world.R, world.I
        for b in range(N):
            r = int(idx[b])
            for t in range(int(qsl[b]), int(qsl[b + 1])):
                p = int(positions[t])
                if r < 0:
                    continue
                if world.sharded[g] and W > 1:
                    vbi, vbo = divmod(p, K * W)
                    if (vbo // I) % W != R:
                        continue
                    lpos = vbi * K + (vbo // (W * I)) * I + vbo % I
                else:
                    lpos = p
                col = lpos // B
                if col < world.widths[g]:
                    out[g, t] = int(host[g][r, col]) * B + lpos % B
    return out


def run_slots(kernels, rng, world, device, lengths, idx, over=1.3):
    host, _, rows = tables(rng, world, device)
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    T = int(qsl[-1])
    Tmax = T + int(rng.integers(0, 20))
    # Positions up to `over` times the longest row's reach: some past the row (the guard).
    reach = max(w // (k // b) * k * (world.W if s else 1)
                for w, k, b, s in zip(world.widths, world.K, world.B, world.sharded))
    positions = rng.integers(0, int(reach * over) + 1, T + 3).astype(np.int64)  # 3 unread extra entries
    positions[T:] = -1
    slots_whole, slots = guarded(np.full((world.G, Tmax), POISON64, dtype=np.int64), device, POISON64, pad=(1, 1, 2, 2))
    qsl_dev = torch.from_numpy(np.concatenate([qsl, [7, 7]]).astype(np.int32)).to(device)  # longer than N + 1
    kernels.slot_mappings(rows, torch.from_numpy(idx.astype(np.int64)).to(device), qsl_dev,
                          torch.from_numpy(positions).to(device), slots, Tmax, **world.kwargs())
    expected = np.full(slots_whole.shape, POISON64, dtype=np.int64)
    expected[1:1 + world.G, 2:2 + Tmax] = expected_slots(world, host, idx, qsl, positions, Tmax)
    assert_same([slots_whole], [expected], "slots")


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("seed", SEEDS)
def test_slot_mappings_random_batches(backend, impl, seed):
    rng = np.random.default_rng(200 + seed)
    world = random_world(rng)
    N = int(rng.integers(0, world.Rmax + 2))
    run_slots(IMPLEMENTATIONS[impl], rng, world, backend.device, rng.integers(0, 12, N), random_idx(rng, world.Rmax, N))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("W", [2, 4])
def test_slot_mappings_dcp_with_interleave_above_the_kernel_block(backend, impl, W):
    """I = 32 > B = 16 and B = 8, K in {32, 64}: ownership in allocation-block
    coordinates; a replicated group and a disabled one beside them."""
    rng = np.random.default_rng(W)
    world = World([32, 64, 16, 32], [16, 8, 16, 16], [8, 16, 6, 4], [True, True, False, True],
                  [True, True, True, False], 4, W, W - 1, 32)
    run_slots(IMPLEMENTATIONS[impl], rng, world, backend.device, [40, 0, 25, 33], np.array([3, -1, 3, 0]), over=1.2)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_slot_mappings_many_groups_and_a_request_longer_than_tiles(backend, impl):
    """Eight groups of different K, B and width; one request of 2500 tokens (three
    1024-token tiles) and the pad crossing tiles too."""
    rng = np.random.default_rng(5)
    world = World([16, 32, 64, 16, 128, 32, 8, 64], [16, 16, 16, 4, 32, 8, 8, 64], [160, 80, 40, 640, 80, 320, 320, 40],
                  [True] * 8, [True] * 7 + [False], 3, 2, 1, 8)
    run_slots(IMPLEMENTATIONS[impl], rng, world, backend.device, [2500, 3, 0], np.array([1, 2, 1]))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_slot_mappings_ids_near_int32_max_do_not_wrap(backend, impl):
    """(2**31 - 1) * 64 + 63 needs 37 bits."""
    device = backend.device
    world = World([128], [64], [2], [True], [True], 1, 1, 0, 1)
    rows = [torch.tensor([[INT32_MAX, INT32_MAX - 1]], dtype=torch.int32, device=device)]
    slots = torch.zeros((1, 6), dtype=torch.int64, device=device)
    IMPLEMENTATIONS[impl].slot_mappings(rows, torch.tensor([0], dtype=torch.int32, device=device),
                                        torch.tensor([0, 4], dtype=torch.int32, device=device),
                                        torch.tensor([0, 63, 64, 128], dtype=torch.int64, device=device), slots, 6,
                                        **world.kwargs())
    # col 0: (2**31-1)*64 = 137438953408 (+63); col 1: (2**31-2)*64 = 137438953344; 128 -> col 2: -1.
    assert slots.cpu().tolist() == [[137438953408, 137438953471, 137438953344, -1, -1, -1]]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_slot_mappings_of_an_empty_batch_pad_everything(backend, impl):
    rng = np.random.default_rng(3)
    world = random_world(rng, G=3)
    run_slots(IMPLEMENTATIONS[impl], rng, world, backend.device, np.zeros(0, dtype=np.int64), np.zeros(0, np.int64))


# ---- a table past 2**31 entries (GPU) ---------------------------------------------------------

@pytest.mark.gpu
def test_row_offsets_past_2_31_entries(backend):
    """rows[0] holds (2**16 + 2) * 2**15 entries (8 GiB, and as much for inp): the last
    row starts at 2**31 + 2**15, where an int32 row offset wraps negative (vLLM #57030)."""
    from blocktable.v2 import BlockTables

    free, _ = torch.cuda.mem_get_info()
    if free < 20 * 2**30:
        pytest.skip(f"needs 20 GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    Rmax, M = 2**16 + 2, 2**15
    bt = BlockTables([16], Rmax, 16, [M], backend=backend)
    last = Rmax - 1
    assert last * bt.widths[0] >= 2**31
    ids = list(range(INT32_MAX - M + 1, INT32_MAX + 1))  # the whole row, up to 2**31 - 1
    bt.append_block_ids(last, (ids,), True)
    bt.append_block_ids(0, ([7],), True)
    bt.apply_staged_writes()
    expected = torch.tensor(ids, dtype=torch.int32, device=backend.device)
    assert torch.equal(bt.rows[0][last], expected)
    assert bt.rows[0][0, 0].item() == 7 and not bt.rows[0][0, 1:].any() and not bt.rows[0][1:last].any()
    # Every batch position takes the last row: b * width passes 2**31 in inp too.
    idx = torch.full((Rmax,), last, dtype=torch.int32, device=backend.device)
    idx[1] = 0
    out = bt.gather_block_tables(idx, Rmax)
    assert torch.equal(out[0][last], expected) and torch.equal(out[0][0], expected)
    assert out[0][1, 0].item() == 7 and not out[0][1, 1:].any()
    d = backend.device
    positions = torch.tensor([0, 16 * M - 1, 16 * M], dtype=torch.int64, device=d)
    slots = bt.compute_slot_mappings(torch.tensor([last], dtype=torch.int32, device=d),
                                     torch.tensor([0, 3], dtype=torch.int32, device=d), positions, 3)
    assert slots.cpu().tolist() == [[ids[0] * 16, INT32_MAX * 16 + 15, -1]]
