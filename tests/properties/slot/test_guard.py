"""The guards around every tensor a kernel under test sees: a stray write into an
input or next to an output is reported, naming the tensor and the rank's call,
and a correct kernel's writes are not."""

import numpy as np
import pytest
import torch

from blocktable import plugin
from blocktable.device import to_host
from blocktable.properties.compare import Discrepancy
from blocktable.properties.lockstep.driver import Lockstep
from blocktable.properties.slot.guard import GUARD_TOKENS, UNWRITTEN, GuardedCall, StagedCall
from blocktable.properties.world import GroupConfig, WorldConfig

TABLE = torch.arange(12, dtype=torch.int32).reshape(3, 4)
QSL = np.array([0, 2, 5], dtype=np.int32)
POSITIONS = np.arange(5, dtype=np.int64)


def on_the_device(ranks, max_tokens):
    """Buffers made and checked on the device (the stateless fuzzer's way)."""
    call = GuardedCall(3, 4, 2, 5, max_tokens, torch.device("cpu"),
                       group=0, ranks=tuple(range(ranks)))
    handed = (call.qsl.load(torch.from_numpy(QSL)), call.positions.load(torch.from_numpy(POSITIONS)),
              call.table.load(TABLE))
    return call, handed


def staged(ranks, max_tokens):
    """Buffers laid out on the host, sent and read back in one copy (the lockstep's way)."""
    call = StagedCall(TABLE.clone(), QSL, POSITIONS, max_tokens,
                      group=0, ranks=tuple(range(ranks)))
    return call, call.inputs()


BOTH = pytest.mark.parametrize("make", [on_the_device, staged])


def guarded_call(make=on_the_device, ranks=2, max_tokens=8):
    call, handed = make(ranks, max_tokens)
    qsl, positions, table = handed
    assert np.array_equal(qsl.numpy(), QSL) and np.array_equal(positions.numpy(), POSITIONS)
    assert torch.equal(table, TABLE)
    return call, [call.output(r) for r in range(ranks)]


@BOTH
def test_writes_inside_the_outputs_pass(make):
    call, outs = guarded_call(make)
    for r, out in enumerate(outs):
        assert bool((out == UNWRITTEN).all())
        out.copy_(torch.arange(8) - r)
    got = call.check()
    if make is staged:  # the outputs come back with the guards, whole
        assert np.array_equal(got, np.stack([np.arange(8), np.arange(8) - 1]))


def test_a_staged_call_compares_with_the_table_as_it_was_copied():
    """The table comes from the implementation's device tensor, not the host: the
    check holds it to the tensor it was copied from."""
    source = TABLE.clone()
    call = StagedCall(source, QSL, POSITIONS, 8)
    call.check()
    call.table.view[1, 2] = 99
    with pytest.raises(Discrepancy, match="block_table guard: the kernel wrote into block_table \\(buffer index \\[3, 6\\]"):
        call.check()


def test_a_staged_call_owns_its_buffers():
    """On the CPU a host array and a tensor can share memory: the kernel's writes must
    reach neither the caller's arrays nor the copy the check compares with."""
    qsl, positions = QSL.copy(), POSITIONS.copy()
    call = StagedCall(TABLE.clone(), qsl, positions, 8)
    handed_qsl, handed_positions, _ = call.inputs()
    handed_positions[0] = 7
    assert np.array_equal(positions, POSITIONS)
    with pytest.raises(Discrepancy, match="positions guard"):
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
@BOTH
def test_a_stray_write_is_reported(make, stray, message):
    call, outs = guarded_call(make)
    stray(call, outs)
    with pytest.raises(Discrepancy, match=message):
        call.check()


@BOTH
def test_an_empty_output_is_a_real_empty_tensor(make):
    call, outs = guarded_call(make, ranks=1, max_tokens=0)
    assert outs[0].numel() == 0 and outs[0].data_ptr() != call.out.buffer.data_ptr()
    call.check()


def test_the_lockstep_names_the_rank_whose_call_wrote_into_an_input(backend, kernels):
    """Every rank's call runs before the guards are checked (one device sync); when
    they were touched, each rank runs again alone to find whose call did it."""
    correct = plugin.load("triton")

    def writes_positions_on_rank_1(qsl, positions, table, out, **kw):
        correct(qsl, positions, table, out, **kw)
        if kw["cp_rank"] == 1 and positions.numel():
            positions[0] += 1

    world = WorldConfig(groups=(GroupConfig(16, 16, sharded=True, cp_interleave=1),), cp_world_size=2,
                        num_blocks=16, max_num_reqs=2, max_model_len=64, max_num_batched_tokens=16)
    run = Lockstep(world, kernels(writes_positions_on_rank_1), backend)
    run.apply({"op": "add"})
    with pytest.raises(Discrepancy, match="group 0 rank 1 positions guard: the kernel wrote into"):
        run.apply({"op": "step", "query": [3]})


def test_a_write_between_staged_buffers_is_reported():
    """The staged buffers sit in one allocation with alignment gaps between them: a
    stray write there belongs to no buffer and still fails the call."""
    call, outs = guarded_call(staged)
    outs[0].fill_(-1)  # the outputs written, as a kernel does: the report must still point at the gap
    gap = call.spans[0][1]  # the table's buffer (7 x 12 int32, 336 bytes) ends before the next 64-byte boundary
    assert gap % 64
    call.device_bytes[gap] = 1
    with pytest.raises(Discrepancy, match=f"group 0 guard: the kernel wrote between the guarded buffers \\(byte {gap}\\)"):
        call.check()


@pytest.mark.parametrize("rows, width, num_reqs, num_tokens, calls, max_tokens",
                         [(3, 5, 2, 7, 2, 9), (1, 0, 0, 0, 1, 1), (6, 40, 4, 33, 4, 64), (2, 3, 1, 1, 1, 1)])
def test_staged_buffers_equal_the_device_built_ones(rows, width, num_reqs, num_tokens, calls, max_tokens):
    """StagedCall lays its buffers out from a cached template of each geometry; what
    a kernel is handed must be, byte for byte, what GuardedCall builds on the device,
    and a second call of the same geometry must not see the first one's inputs."""
    for shift in (0, 100):  # the second call reuses the first one's template
        table = torch.arange(rows * width, dtype=torch.int32).reshape(rows, width) + shift
        qsl = np.linspace(0, num_tokens, num_reqs + 1).astype(np.int32)
        positions = np.arange(num_tokens, dtype=np.int64) + shift
        ranks = tuple(range(calls))
        staged_call = StagedCall(table, qsl, positions, max_tokens, ranks=ranks)
        built = GuardedCall(rows, width, num_reqs, num_tokens, max_tokens, torch.device("cpu"), ranks=ranks)
        built.table.load(table)
        built.qsl.load(torch.from_numpy(qsl))
        built.positions.load(torch.from_numpy(positions))
        for (mine, _), (theirs, _) in zip(staged_call.parts(), built.parts()):
            assert torch.equal(mine.buffer, theirs.buffer)
        outputs = staged_call.check()
        assert outputs.shape == (calls, max_tokens) and (outputs == UNWRITTEN).all()


def test_a_staged_call_checked_after_its_buffers_were_reused_is_refused():
    """Calls of one geometry share their device buffers: checking a call after the next
    one was made would compare its inputs with the next call's, a false alarm. It is
    refused instead, and the newer call checks clean."""
    first = StagedCall(TABLE.clone(), QSL, POSITIONS, 8)
    second = StagedCall(TABLE.clone() + 1, QSL, POSITIONS + 1, 8)
    assert second.device_bytes.data_ptr() == first.device_bytes.data_ptr()
    with pytest.raises(RuntimeError, match="reused this call's buffers"):
        first.check()
    second.check()
    assert torch.equal(second.inputs()[2], TABLE + 1) and np.array_equal(second.inputs()[1].numpy(), POSITIONS + 1)


def test_a_stray_write_does_not_outlive_its_call():
    """A call that finds a stray write leaves the guards broken on the device; the
    next call of that geometry sends them whole again."""
    call, outs = guarded_call(staged)
    call.positions.buffer[-1] = 0
    with pytest.raises(Discrepancy, match="positions guard"):
        call.check()
    again, outs = guarded_call(staged)
    assert again.device_bytes.data_ptr() == call.device_bytes.data_ptr()
    again.check()


def test_staged_calls_in_different_slots_coexist():
    """A step makes one call per group and checks them together: groups of one
    geometry take their own slots, so neither call's buffers are reused by the other."""
    first = StagedCall(TABLE.clone(), QSL, POSITIONS, 8, slot=0)
    second = StagedCall(TABLE.clone() + 1, QSL, POSITIONS + 1, 8, slot=1)
    assert second.device_bytes.data_ptr() != first.device_bytes.data_ptr()
    back = to_host(first.readback() + second.readback())
    first.check(back[:2])
    second.check(back[2:])
    assert torch.equal(first.inputs()[2], TABLE) and torch.equal(second.inputs()[2], TABLE + 1)


def test_a_stray_write_is_reported_from_a_shared_read_back():
    call, outs = guarded_call(staged)
    call.qsl.buffer[-1] = 0
    with pytest.raises(Discrepancy, match="group 0 query_start_loc guard"):
        call.check(to_host(call.readback()))


def test_only_the_group_whose_call_strayed_is_named(backend, kernels):
    """Two groups of the same call geometry (only their interleave differs), checked
    from one read-back: a stray write in group 1's rank-1 call names group 1 and
    that rank."""
    correct = plugin.load("triton")

    def strays_in_group_1_rank_1(qsl, positions, table, out, **kw):
        correct(qsl, positions, table, out, **kw)
        if kw["cp_interleave"] == 2 and kw["cp_rank"] == 1 and positions.numel():
            positions[0] += 1

    world = WorldConfig(groups=(GroupConfig(16, 16, sharded=True, cp_interleave=1),
                                GroupConfig(16, 16, sharded=True, cp_interleave=2)),
                        cp_world_size=2, num_blocks=16, max_num_reqs=2, max_model_len=64, max_num_batched_tokens=16)
    run = Lockstep(world, kernels(strays_in_group_1_rank_1), backend)
    run.apply({"op": "add"})
    with pytest.raises(Discrepancy, match="group 1 rank 1 positions guard: the kernel wrote into"):
        run.apply({"op": "step", "query": [3]})


def test_a_resized_staged_tensor_does_not_reach_the_next_call():
    """The staged buffers of a geometry outlive their call: a kernel that resizes the
    tensors it was handed (a finding) must not hand the next call of that geometry,
    in this program or a later one, its resized tensors."""
    call = StagedCall(TABLE.clone(), QSL, POSITIONS, 8, ranks=(0, 1))
    for tensor in (*call.inputs(), call.output(0), call.output(1)):
        tensor.resize_(1)
    call.check()
    again = StagedCall(TABLE.clone(), QSL, POSITIONS, 8, ranks=(0, 1))
    assert again.device_bytes.data_ptr() == call.device_bytes.data_ptr()
    assert [tuple(t.shape) for t in (*again.inputs(), again.output(0), again.output(1))] == [(3,), (5,), (3, 4), (8,),
                                                                                             (8,)]
