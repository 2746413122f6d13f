"""The guards around every tensor a kernel under test sees: a stray write into an
input or next to an output is reported, naming the tensor and the rank's call,
and a correct kernel's writes are not."""

import pytest
import torch

from blocktable import plugin
from blocktable.properties.compare import Discrepancy
from blocktable.properties.guard import GUARD_TOKENS, UNWRITTEN, GuardedCall
from blocktable.properties.lockstep import Lockstep
from blocktable.properties.world import GroupConfig, WorldConfig


def guarded_call(ranks=2, max_tokens=8):
    call = GuardedCall(3, 4, 2, 5, max_tokens, torch.device("cpu"),
                       outputs=tuple(f"rank {r} slot_mapping" for r in range(ranks)), label="group 0")
    call.table.load(torch.arange(12, dtype=torch.int32).reshape(3, 4))
    call.qsl.load(torch.tensor([0, 2, 5], dtype=torch.int32))
    call.positions.load(torch.arange(5, dtype=torch.int64))
    return call, [call.output(r) for r in range(ranks)]


def test_writes_inside_the_outputs_pass():
    call, outs = guarded_call()
    for out in outs:
        assert bool((out == UNWRITTEN).all())
        out.fill_(-1)
    call.check()


@pytest.mark.parametrize("stray, message", [
    (lambda call, outs: call.out.buffer.__setitem__((1, -1), 0),
     "group 0 rank 1 slot_mapping guard: the kernel wrote outside group 0 rank 1 slot_mapping"),
    (lambda call, outs: call.out.buffer.__setitem__((0, 0), 0),
     "group 0 rank 0 slot_mapping guard: the kernel wrote outside"),
    (lambda call, outs: call.positions.view.__setitem__(2, 99),
     "group 0 positions guard: the kernel wrote into group 0 positions \\(buffer index \\[2\\]"),
    (lambda call, outs: call.table.buffer.__setitem__((0, 0), 7), "group 0 block_table guard"),
    (lambda call, outs: call.qsl.buffer.__setitem__(-1, 0), "group 0 query_start_loc guard"),
    (lambda call, outs: call.out.buffer.__setitem__((0, GUARD_TOKENS + 8), 0),  # one past rank 0's 8 slots
     "group 0 rank 0 slot_mapping guard: the kernel wrote outside group 0 rank 0 slot_mapping \\(buffer index \\[0, 72\\]"),
])
def test_a_stray_write_is_reported(stray, message):
    call, outs = guarded_call()
    stray(call, outs)
    with pytest.raises(Discrepancy, match=message):
        call.check()


def test_an_empty_output_is_a_real_empty_tensor():
    call, outs = guarded_call(ranks=1, max_tokens=0)
    assert outs[0].numel() == 0 and outs[0].data_ptr() != call.out.buffer.data_ptr()
    call.check()


def test_the_lockstep_names_the_rank_whose_call_wrote_into_an_input(backend):
    """Every rank's call runs before the guards are checked (one device sync); when
    they were touched, each rank runs again alone to find whose call did it."""
    correct = plugin.load("triton")

    def writes_positions_on_rank_1(qsl, positions, table, out, **kw):
        correct(qsl, positions, table, out, **kw)
        if kw["cp_rank"] == 1 and positions.numel():
            positions[0] += 1

    world = WorldConfig(groups=(GroupConfig(16, 16, sharded=True, cp_interleave=1),), cp_world_size=2,
                        num_blocks=16, max_num_reqs=2, max_model_len=64, max_num_batched_tokens=16)
    run = Lockstep(world, writes_positions_on_rank_1, backend)
    run.apply({"op": "add"})
    with pytest.raises(Discrepancy, match="group 0 rank 1 positions guard: the kernel wrote into"):
        run.apply({"op": "step", "query": [3]})
