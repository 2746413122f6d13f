"""docs/contract.md §10 through the lockstep: a world keeping V2 block tables beside
the V1 ones runs the same program as V2 calls, and a V2 kernel that is wrong in one
way each is found by the comparisons after a step (whole buffers, every rank)."""

import dataclasses

import numpy as np
import pytest
import torch

from blocktable import plugin
from blocktable.properties.compare import Discrepancy
from blocktable.properties.lockstep import events
from blocktable.properties.lockstep.driver import Lockstep
from blocktable.properties.lockstep.v2 import Batch
from blocktable.properties.world import GroupConfig, V2Config, WorldConfig
from blocktable.v2_torch import append_torch, gather_torch, slot_mappings_torch


def v2_world(**changes) -> WorldConfig:
    # Two groups of different block sizes (one hybrid: K = 8 over B = 2) under DCP 2,
    # interleaved 4 at a time: more than B, where allocation-block and kernel-block
    # coordinates differ (vLLM #51031; with I dividing B they agree).
    world = WorldConfig(groups=(GroupConfig(4, 4, cp_interleave=4), GroupConfig(8, 2, cp_interleave=4)),
                        cp_world_size=2, num_blocks=40, null_block=True, max_num_reqs=4, max_model_len=64,
                        max_num_batched_tokens=32, v2=V2Config())
    return dataclasses.replace(world, **changes)


def with_v2(plugins, **kernels) -> plugin.Plugins:
    """`plugins` with some V2 kernels replaced by these functions."""
    ours = plugins.v2 or plugin.load_v2_kernels(ours="torch")
    return dataclasses.replace(plugins, v2=dataclasses.replace(ours, **kernels))


def program(run: Lockstep) -> None:
    """Requests admitted, grown, one preempted and resumed (an overwrite into a slot
    with a longer stale row), a hole in the rows (a dummy), padded steps."""
    a = run.apply({"op": "add"})
    b = run.apply({"op": "add"})
    run.apply({"op": "step", "query": [9, 12]})
    run.apply({"op": "step", "query": [1, 1], "pad": 1})
    run.apply({"op": "preempt", "request": a})
    run.apply({"op": "step", "query": [0, 3]})  # row 0 is a hole: a dummy in the batch
    c = run.apply({"op": "add"})
    run.apply({"op": "step", "query": [2, 1], "pad": 2})
    run.apply({"op": "finish", "request": c})
    run.apply({"op": "resume", "request": a})
    run.apply({"op": "step", "query": [5, 1, 0, 0]})
    run.apply({"op": "step", "query": [4, 1]})
    assert run.requests[b].written == 19


@pytest.mark.parametrize("ours", ["torch", "triton"])
def test_a_program_runs_the_same_as_v2_calls(backend, kernels, ours):
    run = Lockstep(v2_world(), with_v2(kernels("reference"), **dict(
        zip(("append", "gather", "slots"), (plugin.load_v2(k, ours) for k in ("append", "gather", "slots")))),
        specs=dict.fromkeys(("append", "gather", "slots"), ours)), backend)
    program(run)
    for label in (events.V2_OVERWRITE, events.V2_PERMUTED, events.V2_DUMMY, events.V2_PADDED,
                  events.V2_BLOCK_SIZES, events.V2_DCP, events.V2_STALE):
        assert run.events[label], label
    # Both designs hold the same rows: every live request's V2 count is its V1 count.
    ref = run.v2.reference[0]
    for rid in run.live():
        row, slot = run.requests[rid].row, run.v2.slot[rid]
        assert [int(ref.cnt[g, slot]) for g in range(2)] == [int(t.count[row]) for t in run.reference.tables.tables]


def gather_by_batch_index(rows, cnt_dev, inp, idx_mapping, num_reqs_padded):
    """vLLM-shaped bug: batch position b reads slot b's row."""
    gather_torch(rows, cnt_dev, inp, torch.arange(idx_mapping.numel(), dtype=idx_mapping.dtype,
                                                  device=idx_mapping.device), num_reqs_padded)


def append_ignoring_overwrite(rows, cnt_dev, cnt, staged_group, staged_row, staged_start, staged_ids, cu_staged):
    """Lands every write one column late (a start taken as the count before it)."""
    append_torch(rows, cnt_dev, cnt, staged_group, staged_row, staged_start + 1, staged_ids, cu_staged)


def slots_in_user_blocks(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, *,
                         kv_block_sizes, kernel_block_sizes, sharded, enabled, cp_world_size, cp_rank, cp_interleave):
    """vLLM #51031: DCP ownership in kernel-block coordinates (K taken as B)."""
    slot_mappings_torch(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded,
                        kv_block_sizes=kernel_block_sizes, kernel_block_sizes=kernel_block_sizes, sharded=sharded,
                        enabled=enabled, cp_world_size=cp_world_size, cp_rank=cp_rank, cp_interleave=cp_interleave)


@pytest.mark.parametrize("kind, fn, part", [
    ("gather", gather_by_batch_index, "V2 input table"),
    ("append", append_ignoring_overwrite, "V2 persistent rows"),
    ("slots", slots_in_user_blocks, "V2 slot mappings"),
])
def test_a_wrong_v2_kernel_is_found_after_its_step(backend, kernels, kind, fn, part):
    run = Lockstep(v2_world(), with_v2(kernels("reference"), **{kind: fn}), backend)
    with pytest.raises(Discrepancy) as error:
        program(run)
    assert error.value.part == part


def test_a_slot_mapping_difference_is_told_in_the_batch_s_terms(backend, kernels):
    run = Lockstep(v2_world(), with_v2(kernels("reference"), slots=slots_in_user_blocks), backend)
    with pytest.raises(Discrepancy) as error:
        program(run)
    note = " ".join(error.value.notes)
    assert "batch position" in note and "request" in note and "position" in note


def test_a_gather_that_returns_a_copy_is_found(backend, kernels):
    """§10.9: a captured graph reads the persistent buffers; the wrapper returns views
    of them. Ours, with its inp replaced by fresh tensors after the call, is not."""
    run = Lockstep(v2_world(), kernels("reference"), backend)
    ours = run.v2.impl[0]
    original = ours.gather_block_tables
    ours.gather_block_tables = lambda *a: tuple(t.clone() for t in original(*a))
    run.apply({"op": "add"})
    with pytest.raises(Discrepancy, match="returned a copy"):
        run.apply({"op": "step", "query": [3]})


def test_the_v2_wrappers_data_checks_run_on_a_programs_first_step_only(backend, kernels, monkeypatch):
    """BlockTables' data checks read the device back (a sync each, twice a rank a
    step); the harness's batches are valid by construction, so, as for the V1
    kernel, they run on the first step alone."""
    import blocktable.v2

    checked = []
    monkeypatch.setattr(blocktable.v2, "check_data", lambda *a, **k: checked.append(len(checked)))
    run = Lockstep(v2_world(), kernels("reference"), backend)
    run.apply({"op": "add"})
    run.apply({"op": "add"})
    run.apply({"op": "step", "query": [3, 2]})
    assert len(checked) == 4  # gather_block_tables and compute_slot_mappings, on each of two ranks
    run.apply({"op": "step", "query": [1, 1]})
    run.apply({"op": "step", "query": [2, 0]})
    assert len(checked) == 4


def test_the_batch_is_the_v1_rows_permuted_alike_on_replay():
    class Fake:
        def __init__(self, steps):
            self.steps_checked = steps
            self.rows = [10, None, 11, 12]
            self.world = WorldConfig(max_num_batched_tokens=32)

    qsl = np.array([0, 2, 2, 5, 6], dtype=np.int32)
    positions = np.array([7, 8, 0, 1, 2, 4], dtype=np.int64)
    values = np.arange(100, 106, dtype=np.int64)
    slot = {10: 3, 11: 0, 12: 1}
    first, again = (Batch.of(Fake(5), slot, qsl, positions, values, 4, 6) for _ in range(2))
    assert np.array_equal(first.order, again.order) and first.idx.dtype == np.int64
    assert sorted(first.order.tolist()) == [0, 1, 2, 3]
    extra = 0
    for b, r in enumerate(first.order):
        rid = Fake(5).rows[r]
        assert first.idx[b] == (slot[rid] if rid is not None else -1)
        got = first.values[first.qsl[b]:first.qsl[b + 1]]
        if rid is None:  # a dummy's own tokens: (step + b) % 3 of them, writing nothing
            assert len(got) == (5 + b) % 3 and not got.any()
            extra = len(got)
        else:
            assert np.array_equal(got, values[qsl[r]:qsl[r + 1]])
            assert np.array_equal(first.positions[first.qsl[b]:first.qsl[b + 1]], positions[qsl[r]:qsl[r + 1]])
    assert first.tokens_padded == 6 + extra + 2


def test_a_v2_world_is_kept_in_case_files_and_checked():
    world = v2_world(v2=V2Config((True, False)))
    assert WorldConfig.from_json(world.to_json()) == world
    assert "v2" not in dataclasses.replace(world, v2=None).to_json()
    with pytest.raises(ValueError, match="one cp_interleave"):
        v2_world(groups=(GroupConfig(4, 4, cp_interleave=2), GroupConfig(8, 2, cp_interleave=4)))
    with pytest.raises(ValueError, match="one true or false per group"):
        v2_world(v2=V2Config((True,)))
