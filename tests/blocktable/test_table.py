"""The device-backed table against the reference, operation by operation, whole
buffers compared after each step (host rows, counts, committed device rows)."""

import numpy as np
import pytest
import torch

from blocktable.properties.lockstep.check import check_table
from blocktable.reference import BlockTable as ReferenceTable
from blocktable.reference import GroupLayout
from blocktable.table import BlockTable

# Each script is a list of (operation, args). Hand-written to hit the contract's traps:
# stale tails after add_row, move onto a longer row, self-move, self-swap, commit of
# fewer rows than are filled, append after clear.
SCRIPT = [
    ("append_row", ([5, 6, 7], 0)), ("append_row", ([8], 0)), ("append_row", ([1, 2, 3, 4, 5], 2)),
    ("commit", (3,)), ("add_row", ([9], 0)), ("move_row", (0, 2)), ("move_row", (1, 1)),
    ("commit", (1,)), ("swap_row", (1, 2)), ("swap_row", (3, 3)), ("append_row", ([], 3)),
    ("clear_row", (1,)), ("add_row", ([4, 4], 3)), ("commit", (4,)), ("append_row", ([7], 2)),
    ("move_row", (3, 0)), ("swap_row", (0, 3)), ("commit", (2,)), ("clear", ()),
    ("append_row", ([11, 12], 1)), ("commit", (4,)),
]


@pytest.mark.parametrize("K, B, W, sharded", [(16, 16, 1, True), (32, 16, 1, True), (96, 32, 2, True),
                                              (16, 8, 4, False)])
def test_scripted_row_operations_match_the_reference(backend, K, B, W, sharded):
    ref = ReferenceTable(4, 800, GroupLayout(K, B, sharded=sharded, cp_world_size=W))
    impl = BlockTable(4, 800, kv_block_size=K, kernel_block_size=B, sharded=sharded, cp_world_size=W,
                      backend=backend)
    assert impl.width == ref.width
    for step, (op, args) in enumerate(SCRIPT):
        getattr(ref, op)(*args)
        getattr(impl, op)(*args)
        check_table(0, ref, impl, note=f"step {step} {op}{args}")


def test_device_copy_lives_on_the_backend_device(backend):
    impl = BlockTable(2, 64, kv_block_size=16, kernel_block_size=16, backend=backend)
    assert impl.device_tensor.device.type == backend.device.type
    assert impl.device_tensor.dtype == torch.int32


def test_commit_is_a_snapshot_even_when_the_host_changes_at_once(backend):
    """With a pinned buffer and an asynchronous copy, the host edit right after
    commit must not reach the device; the staging buffer makes it a snapshot."""
    impl = BlockTable(64, 4096, kv_block_size=16, kernel_block_size=16, backend=backend)
    for r in range(64):
        impl.append_row(list(range(1, 200)), r)
    expected = impl.host.copy()
    impl.commit(64)
    impl.host[:] = 7  # immediately, while a GPU copy could still be in flight
    impl.commit(0)
    assert np.array_equal(impl.device_rows(), expected)


def test_cuda_graph_padding_matches_the_reference(backend):
    ref = ReferenceTable(4, 64, GroupLayout(16, 16))
    impl = BlockTable(4, 64, kv_block_size=16, kernel_block_size=16, backend=backend)
    for r in range(4):
        ref.append_row([r + 1, r + 2], r)
        impl.append_row([r + 1, r + 2], r)
    ref.commit(4)
    impl.commit(4)
    expected = ref.pad_for_cuda_graph(1, 3)
    got = impl.pad_for_cuda_graph(1, 3)
    assert np.array_equal(got.cpu().numpy(), expected)
    check_table(0, ref, impl, note="after padding")


@pytest.mark.parametrize("call, error, match", [
    (lambda t: t.append_row([1] * 7, 0), ValueError, "row 0 overflows: it holds 2 entries, appending 7 kernel blocks"),
    (lambda t: t.add_row([1] * 9, 0), ValueError, "row 0 overflows: 9 kernel blocks exceed width 8"),
    (lambda t: t.append_row([1], 4), ValueError, "row 4 is out of range \\[0, 4\\)"),
    (lambda t: t.append_row([1], 1.5), TypeError, "row must be an int, got float"),
    (lambda t: t.append_row([-3], 0), ValueError, "block id -3 does not fit"),
    (lambda t: t.append_row([2**31], 0), ValueError, "block id 2147483648 does not fit"),
    (lambda t: t.append_row([1.0], 0), TypeError, "block ids must be a flat sequence of ints"),
    (lambda t: t.move_row(0, -1), ValueError, "dst -1 is out of range"),
    (lambda t: t.swap_row(0, 4), ValueError, "b 4 is out of range"),
    (lambda t: t.commit(5), ValueError, "commit count 5 is out of range \\[0, 4\\]"),
    (lambda t: t.pad_for_cuda_graph(2, 1), ValueError, "num_reqs \\(2\\) <= num_reqs_padded \\(1\\)"),
])
def test_bad_calls_are_rejected_and_change_nothing(backend, rejects, call, error, match):
    impl = BlockTable(4, 128, kv_block_size=16, kernel_block_size=16, backend=backend)
    impl.append_row([1, 2], 0)
    impl.commit(1)
    rejects(impl, error, match, call, impl)


@pytest.mark.parametrize("kwargs, match", [
    (dict(kv_block_size=24, kernel_block_size=16), "kv_block_size 24 must be a positive multiple of kernel_block_size 16"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_interleave=3), "cp_interleave 3 must divide kv_block_size 16"),
    (dict(kv_block_size=16, kernel_block_size=16, cp_world_size=0), "cp_world_size must be >= 1, got 0"),
])
def test_bad_configuration_is_rejected(backend, kwargs, match):
    with pytest.raises(ValueError, match=match):
        BlockTable(4, 128, backend=backend, **kwargs)
