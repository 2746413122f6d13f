"""The plug-in contract's data checks read the device back once per call: a small
batch comes back whole, a large one as query_start_loc and one flag. Both ways
must name the same errors."""

import numpy as np
import pytest
import torch

from blocktable.checks import SMALL_BATCH, check_slot_inputs


def _inputs(T, device, negative_at=None, first=0):
    positions = torch.arange(T, dtype=torch.int64, device=device)
    if negative_at is not None:
        positions[negative_at] = -3
    qsl = torch.tensor([first, T // 2, T], dtype=torch.int32, device=device)
    table = torch.zeros((2, 4), dtype=torch.int32, device=device)
    out = torch.empty(T, dtype=torch.int64, device=device)
    return qsl, positions, table, out


@pytest.mark.parametrize("T", [5, SMALL_BATCH, SMALL_BATCH + 1, 3 * SMALL_BATCH])
def test_good_input_passes_both_ways(backend, T):
    assert check_slot_inputs(*_inputs(T, backend.device), backend) == (2, T, T)


@pytest.mark.parametrize("T", [5, SMALL_BATCH, SMALL_BATCH + 1, 3 * SMALL_BATCH])
def test_a_negative_position_is_named_both_ways(backend, T):
    at = T - 2
    with pytest.raises(ValueError, match=f"position -3 of token {at} is negative"):
        check_slot_inputs(*_inputs(T, backend.device, negative_at=at), backend)


@pytest.mark.parametrize("T", [5, 3 * SMALL_BATCH])
def test_a_bad_query_start_loc_is_named_both_ways(backend, T):
    with pytest.raises(ValueError, match="query_start_loc\\[0\\] must be 0, got 1"):
        check_slot_inputs(*_inputs(T, backend.device, first=1), backend)


def test_the_small_way_reads_no_position_past_the_batch(backend):
    """The positions come back as [:T] of the tensor handed in, not its storage."""
    qsl, positions, table, out = _inputs(6, backend.device)
    storage = torch.cat([positions, torch.tensor([-9], dtype=torch.int64, device=backend.device)])
    assert check_slot_inputs(qsl, storage[:6], table, out, backend) == (2, 6, 6)
    assert np.array_equal(storage[:6].cpu().numpy(), np.arange(6))
