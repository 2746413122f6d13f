"""Our slot-mapping kernels against the reference (docs/contract.md §4), bit for bit over the
whole [Tmax] output. The output is poisoned before every launch, so a slot the
kernel forgets to write shows as the poison value instead of passing by luck."""

import contextlib
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given

from blocktable import plugin, slot
from blocktable.properties.slot import draw as strategies
from blocktable.properties.slot.examples import SPEC_EXAMPLES
from blocktable.reference import slot_mapping as reference_slot_mapping

POISON = 0x5A5A5A5A5A5A5A5A  # never a slot and never -1
KERNELS = ["triton-tiled", "triton-specialized", "triton-per-request"]
# The tiled kernels with their launch forced to 16-token tiles, in both search modes,
# so that small inputs hold unmasked tiles, tiles inside one request, tiles spanning
# several, and a masked tail (the default launches use 256- or 1024-token tiles).
SMALL_TILES = {"tiled-16-per-token": ("triton-tiled", (16, 4, False)),
               "tiled-16-whole-tiles": ("triton-tiled", (16, 4, True)),
               "specialized-16-whole-tiles": ("triton-specialized", (16, 4, True))}
VARIANTS = [*KERNELS, *SMALL_TILES]
# Random calls draw many configurations, and on a GPU the specialized kernel compiles
# for each; its body is the tiled one's, so small tiles run on the run-time kernel.
RANDOM_VARIANTS = [*KERNELS, "tiled-16-per-token", "tiled-16-whole-tiles"]


def launch(name, qsl, positions, table, tmax, device, **kw):
    kernel, forced = SMALL_TILES.get(name, (name, None))
    out = torch.full((tmax,), POISON, dtype=torch.int64, device=device)
    with mock.patch.object(slot, "tiled_launch", lambda *a, **k: forced) if forced else contextlib.nullcontext():
        plugin.load(kernel)(torch.from_numpy(qsl).to(device), torch.from_numpy(positions).to(device),
                            torch.from_numpy(table).to(device), out, **kw)
    return out.cpu().numpy()


@pytest.mark.parametrize("kernel", VARIANTS)
@pytest.mark.parametrize("example", SPEC_EXAMPLES, ids=lambda e: e.name)
def test_spec_worked_example(backend, kernel, example):
    qsl, pos, table = example.inputs()
    got = launch(kernel, qsl, pos, table, example.tmax, backend.device, **example.kwargs())
    assert np.array_equal(got, example.expected_mapping())


@pytest.mark.parametrize("kernel", RANDOM_VARIANTS)
@given(case=strategies.slot_cases())
def test_random_calls_match_the_reference(backend, kernel, case):
    expected = reference_slot_mapping(case.query_start_loc, case.positions, case.block_table,
                                      case.max_num_tokens, **case.config.kwargs())
    got = launch(kernel, case.query_start_loc, case.positions, case.block_table, case.max_num_tokens,
                 backend.device, **case.config.kwargs())
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("lengths", [(1023,), (1024,), (1025,), (1023, 1, 1025), (0, 1024, 0), (2049,)])
def test_tile_boundaries(backend, kernel, lengths):
    """Requests that end just before, at and after the 1024-token tile, and empty ones."""
    K = B = 16
    width = 160  # 2560 tokens
    qsl = np.zeros(len(lengths) + 1, np.int32)
    qsl[1:] = np.cumsum(lengths)
    positions = np.concatenate([np.arange(n, dtype=np.int64) + 7 * r for r, n in enumerate(lengths)])
    rng = np.random.default_rng(len(lengths))
    table = rng.integers(1, 2**31 - 1, size=(len(lengths) + 1, width), dtype=np.int32)
    tmax = int(qsl[-1]) + 5
    kw = dict(kv_block_size=K, kernel_block_size=B)
    expected = reference_slot_mapping(qsl, positions, table, tmax, **kw)
    assert np.array_equal(launch(kernel, qsl, positions, table, tmax, backend.device, **kw), expected)


@pytest.mark.parametrize("interpreted, tmax, tokens, requests, expected", [
    (False, 1024, 1024, 1024, (64, 2, False)),  # decode: small tiles, the most programs
    (False, 8192, 8192, 64, (256, 8, False)),  # 128-token requests, shorter than a tile
    (False, 16384, 16384, 1, (256, 8, True)),  # one long prefill
    (False, 2**20, 2**20, 256, (512, 4, True)),  # large: bandwidth-bound tiles
    (False, 2**20, 2**20, 2**19, (512, 4, False)),  # two tokens per request: every tile spans requests
    (False, 2**20, 2**20, 2**20, (64, 2, False)),  # a million decode requests
    (True, 16, 3, 3, (1024, 4, True)),  # the interpreter: always whole tiles first
])
def test_the_launch_takes_the_whole_tile_search_where_requests_span_tiles(interpreted, tmax, tokens, requests,
                                                                          expected):
    backend = mock.Mock(interpreted=interpreted)
    assert slot.tiled_launch(backend, tmax, tokens, requests) == expected


@pytest.mark.parametrize("kernel", list(SMALL_TILES))
def test_a_request_edge_at_every_offset_of_a_tile(backend, kernel):
    """Two requests meeting at each token of the first three 16-token tiles (then an
    empty request and a short one): a tile whose first request ends one token early
    must not be mapped as that request's alone."""
    K = B = 16
    rng = np.random.default_rng(0)
    table = rng.integers(1, 2**31 - 1, size=(5, 8), dtype=np.int32)
    kw = dict(kv_block_size=K, kernel_block_size=B)
    for split in range(49):
        lengths = (split, 48 - split, 0, 3)
        qsl = np.zeros(5, np.int32)
        qsl[1:] = np.cumsum(lengths)
        positions = np.concatenate([np.arange(n, dtype=np.int64) + 5 * r for r, n in enumerate(lengths)])
        expected = reference_slot_mapping(qsl, positions, table, 56, **kw)
        got = launch(kernel, qsl, positions, table, 56, backend.device, **kw)
        assert np.array_equal(got, expected), f"requests of {lengths} tokens"


@pytest.mark.parametrize("kernel", KERNELS)
def test_block_ids_near_int32_max_do_not_wrap(backend, kernel):
    """(2**31-1) * 64 needs 37 bits: an int32 product wraps negative."""
    K, B = 128, 64
    table = np.array([[2**31 - 1, 2**31 - 2, 2**31 - 3, 2**31 - 4]], np.int32)
    positions = np.array([0, 63, 64, 127, 128, 255], np.int64)
    qsl = np.array([0, 6], np.int32)
    got = launch(kernel, qsl, positions, table, 8, backend.device, kv_block_size=K, kernel_block_size=B)
    # col = p // 64: 0 -> (2**31-1)*64 = 137438953408; 63 -> +63; 64 -> (2**31-2)*64 = 137438953344;
    # 127 -> 137438953407; 128 -> (2**31-3)*64 = 137438953280; 255 -> (2**31-4)*64 + 63 = 137438953279.
    assert got.tolist() == [137438953408, 137438953471, 137438953344, 137438953407, 137438953280,
                            137438953279, -1, -1]


@pytest.mark.parametrize("kernel", KERNELS)
def test_positions_past_the_row_are_padded_not_read(backend, kernel):
    """The guard vLLM lacks: a column past the row must give -1, not the next row's entry."""
    table = np.array([[1, 2], [9, 9]], np.int32)
    qsl = np.array([0, 3], np.int32)
    positions = np.array([31, 32, 100], np.int64)
    got = launch(kernel, qsl, positions, table, 3, backend.device, kv_block_size=16, kernel_block_size=16)
    assert got.tolist() == [2 * 16 + 15, -1, -1]


def _tensors(device):
    return (torch.tensor([0, 2], dtype=torch.int32, device=device),
            torch.tensor([0, 1], dtype=torch.int64, device=device),
            torch.ones((2, 8), dtype=torch.int32, device=device),
            torch.full((4,), POISON, dtype=torch.int64, device=device))


@pytest.mark.parametrize("mutate, error, match", [
    (lambda a: (a[0].long(), *a[1:]), TypeError, "query_start_loc must be torch.int32, got torch.int64"),
    (lambda a: (a[0], a[1].int(), *a[2:]), TypeError, "positions must be torch.int64, got torch.int32"),
    (lambda a: (*a[:2], a[2].long(), a[3]), TypeError, "block_table must be torch.int32, got torch.int64"),
    (lambda a: (*a[:3], a[3].int()), TypeError, "slot_mapping must be torch.int64, got torch.int32"),
    (lambda a: (a[0].numpy() if a[0].device.type == "cpu" else a[0].cpu().numpy(), *a[1:]), TypeError,
     "query_start_loc must be a torch.Tensor, got ndarray"),
    (lambda a: (*a[:2], a[2][0], a[3]), ValueError, "block_table must be 2-D, got shape \\(8,\\)"),
    (lambda a: (a[0], a[1].new_tensor([0, -4]), *a[2:]), ValueError, "position -4 of token 1 is negative"),
    (lambda a: (a[0].new_tensor([1, 2]), *a[1:]), ValueError, "query_start_loc\\[0\\] must be 0, got 1"),
    (lambda a: (a[0].new_tensor([0, 2, 1, 2]), a[1], a[2].new_ones((3, 8)), a[3]), ValueError,
     "query_start_loc decreases at request 1: 2 -> 1"),
    (lambda a: (a[0].new_tensor([0, 1]), *a[1:]), ValueError, "query_start_loc\\[N\\] = 1 but there are 2 positions"),
    (lambda a: (*a[:3], a[3][:1]), ValueError, "2 scheduled tokens exceed max_num_batched_tokens 1"),
    (lambda a: (a[0].new_tensor([0, 0, 1, 1, 2]), *a[1:]), ValueError, "4 requests but the block table has only 2 rows"),
    (lambda a: (a[0], a[1].new_tensor([0, 1, 2, 3])[::2], *a[2:]), ValueError, "positions must be contiguous"),
])
@pytest.mark.parametrize("kernel", KERNELS)
def test_bad_input_is_rejected_before_any_launch(backend, kernel, mutate, error, match):
    args = mutate(_tensors(backend.device))
    before = args[3].clone() if isinstance(args[3], torch.Tensor) else None
    with pytest.raises(error, match=match):
        plugin.load(kernel)(*args, kv_block_size=16, kernel_block_size=16, cp_world_size=1, cp_rank=0,
                            cp_interleave=1)
    if before is not None:
        assert torch.equal(args[3], before)  # nothing was written


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kv_block_size=24, kernel_block_size=16), ValueError, "kv_block_size 24 must be a positive multiple"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_world_size=2, cp_rank=2), ValueError, "cp_rank 2 is out of range"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_world_size=2, cp_interleave=5), ValueError, "cp_interleave 5"),
    (dict(kv_block_size=16, kernel_block_size=np.int64(16)), TypeError, "kernel_block_size must be an int"),
])
def test_bad_configuration_is_rejected(backend, kernel, kwargs, error, match):
    args = _tensors(backend.device)
    with pytest.raises(error, match=match):
        plugin.load(kernel)(*args, **{"cp_world_size": 1, "cp_rank": 0, "cp_interleave": 1, **kwargs})
    assert bool((args[3] == POISON).all())


def test_a_tensor_on_the_wrong_device_is_a_clear_error(backend):
    other = torch.device("meta")
    args = list(_tensors(backend.device))
    args[1] = args[1].to(other)
    with pytest.raises(ValueError, match="positions is on meta, but kernels run on"):
        plugin.load("triton")(*args, kv_block_size=16, kernel_block_size=16, cp_world_size=1, cp_rank=0,
                              cp_interleave=1)
