"""docs/contract.md §7 after every step: each live sequence read back through the device tables
and paged caches equals its history, each token held by exactly one rank. A value
changed in a cache behind the harness's back is named by request and position."""

import dataclasses

import pytest
import torch

from blocktable import plugin
from blocktable.checks import data_checks_enabled
from blocktable.oracle import poison_value
from blocktable.properties.compare import Discrepancy
from blocktable.properties.lockstep.driver import Lockstep
from blocktable.properties.run.prepare import plugins_for
from blocktable.properties.slot.compare import SlotDiscrepancy
from blocktable.properties.world import GroupConfig, WorldConfig
from blocktable.table import BlockTable


def two_requests(backend, W, kernel=None):
    """Request 0 computes 3 tokens (values 1-3), request 1 five (values 4-8)."""
    world = WorldConfig(groups=(GroupConfig(4, 4, sharded=True, cp_interleave=2),), cp_world_size=W,
                        num_blocks=16, max_num_reqs=2, max_model_len=64, max_num_batched_tokens=16)
    run = Lockstep(world, plugins_for(kernel or "triton", {}, backend), backend)
    run.apply({"op": "add"})
    run.apply({"op": "add"})
    run.apply({"op": "step", "query": [3, 5]})
    return run


def where(run, value):
    """(rank, slot index) of the one cache cell holding `value`."""
    cells = (run.caches[0].data == value).nonzero().tolist()
    assert len(cells) == 1
    return tuple(cells[0])


@pytest.mark.parametrize("W", [1, 2])
def test_a_wrong_value_is_named(backend, W):
    run = two_requests(backend, W)
    run.caches[0].data[where(run, 6)] = 999  # request 1, position 2
    with pytest.raises(Discrepancy, match="group 0 data read-back: request 1 position 2: expected value 6, "
                                          "read 999 \\(1 of 8 values differ\\)"):
        run.apply({"op": "step", "query": [0, 0]})


@pytest.mark.parametrize("W", [1, 2])
def test_a_token_no_rank_holds_is_named(backend, W):
    run = two_requests(backend, W)
    run.caches[0].data[where(run, 2)] = poison_value()  # request 0, position 1
    with pytest.raises(Discrepancy, match="group 0 data read-back: position 1 of request 0 is held by 0 ranks"):
        run.apply({"op": "step", "query": [0, 0]})


def test_an_untouched_cache_reads_back_clean(backend):
    run = two_requests(backend, 2)
    run.apply({"op": "step", "query": [1, 1]})
    assert run.steps_checked == 2


def test_the_check_after_a_later_operation_reads_the_device_tables_again(backend):
    """A step brings the device tables back with its data and the check after it uses
    them; the next operation's check must read them afresh, not reuse the step's."""
    run = two_requests(backend, 2)
    run.impl.tables[0].device_tensor[1, 0] += 1  # behind the harness's back, after the step
    with pytest.raises(Discrepancy, match="group 0 table device rows"):
        run.apply({"op": "swap", "a": 0, "b": 0})


def padding_from(first_row, fill):
    """A pad_for_cuda_graph that fills rows [first_row, num_reqs_padded) with `fill`."""
    def pad(self, num_reqs, num_reqs_padded):
        self.device_tensor[first_row:num_reqs_padded].fill_(fill)
        return self.device_tensor[:num_reqs_padded]
    return pad


@pytest.mark.parametrize("first_row, fill", [(1, -1), (0, 0)], ids=["pads with -1", "pads a scheduled row"])
def test_a_padding_bug_is_named_as_one(backend, monkeypatch, first_row, fill):
    """The padded rows come back with the step's data; when the padding also broke a
    row the kernel then read, the padding is still what the report names."""
    run = two_requests(backend, 1)
    run.apply({"op": "finish", "request": 1, "clear": True})
    monkeypatch.setattr(BlockTable, "pad_for_cuda_graph", padding_from(first_row, fill))
    with pytest.raises(Discrepancy, match="group 0 padded table"):
        run.apply({"op": "step", "query": [1], "pad": 1})


def test_slots_outside_the_cache_are_named_as_the_kernels_and_written_nowhere(backend):
    """A step's cache writes go through the kernel's slots before those are compared
    (one device sync per step): a slot outside the cache must be skipped there, and
    the report must name the slot mapping, not the oracle."""
    run = two_requests(backend, 2)
    before = run.caches[0].data.clone()
    ours = plugin.load("triton")

    def far(qsl, positions, table, out, **config):
        ours(qsl, positions, table, out, **config)
        out[:positions.numel()] = 2**40

    run.kernels = dataclasses.replace(run.kernels, slot=far)
    with pytest.raises(SlotDiscrepancy, match="group 0 rank 0 slot mapping: 2 of 16 slots differ"):
        run.apply({"op": "step", "query": [1, 1]})
    assert torch.equal(run.caches[0].data, before)


def test_the_wrappers_data_checks_run_on_a_programs_first_call_only(backend):
    seen = []
    ours = plugin.load("triton")

    def recording(*args, **config):
        seen.append(data_checks_enabled())
        ours(*args, **config)

    run = two_requests(backend, 2, kernel=recording)
    run.apply({"op": "step", "query": [1, 1]})
    assert seen == [True, False, False, False]  # two ranks a step
