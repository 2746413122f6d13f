"""A scheduling step's device side: launching, the one read-back, the comparisons.

Everything a step does on the device is launched first: every group's kernel calls
(all its DCP ranks on one set of guarded inputs), its copy-on-write copies, the
writes of the step's values into its paged caches through the slot mappings the
kernel returned, then every live sequence's read-back. It all comes back in one
copy (`ReadBack`: each read-back waits for the device), and is compared in a fixed
order: each group's guards and inputs, its slot mappings against the reference on
every rank, the CUDA-graph padding, then the data (docs/contract.md §4, §5, §7).
A discrepancy in the kernel's calls is explained by the padding first, when the
padding broke the table the kernel then read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

import numpy as np
import torch

from blocktable.checks import data_checks
from blocktable.device import to_host, upload_arrays
from blocktable.oracle import Reads, poison_value
from blocktable.plugin import SLOT_MAPPING
from blocktable.properties.classes.table import ClassSlotCall, DrivenTables
from blocktable.properties.compare import Discrepancy, Handed, assert_arrays_equal, same_values
from blocktable.properties.lockstep import events
from blocktable.properties.lockstep.state import State
from blocktable.properties.slot.compare import check_slot_mapping
from blocktable.properties.slot.guard import StagedCall
from blocktable.reference import slot_mappings_all_ranks as reference_slot_mappings

Padded = list[tuple[int, np.ndarray, torch.Tensor]]  # (group, expected rows, the rows the implementation returned)


@dataclass
class ReadBack:
    """A step's one copy to the host, each part by name (one list entry per group,
    except `padded`, which is empty when the step was not padded)."""

    tables: list[np.ndarray]  # the device tables after the step
    handed: list[np.ndarray]  # the guarded bytes each group's calls were handed, as the kernel left them
    padded: list[np.ndarray]  # the rows pad_for_cuda_graph returned
    reads: list[np.ndarray]  # the data read back, [ranks, reads]
    kv: list[np.ndarray]  # in a world with KV caches: each group's cache memory and gathered keys and values
    v2: list[np.ndarray]  # in a world with V2 tables: every rank's V2 state, then the V2 data read back

    @classmethod
    def fetch(cls, **parts: list[torch.Tensor]) -> ReadBack:
        names = [f.name for f in fields(cls)]
        back = iter(to_host([tensor for name in names for tensor in parts[name]]))
        return cls(**{name: [next(back) for _ in parts[name]] for name in names})


@dataclass
class LaunchedReads:
    """A step's read-back, launched: (request, length) of each sequence read, the
    row and position of each read, and each group's [ranks, reads] result."""

    held: list[tuple[int, int]]
    rows: np.ndarray
    positions: np.ndarray
    tensors: list[torch.Tensor]


def launch_and_check(state: State, qsl: np.ndarray, positions: np.ndarray, values: np.ndarray, N: int,
                     written: dict[int, int], padded: Padded, N_pad: int) -> tuple[ReadBack, LaunchedReads]:
    """Launch the step's device work, bring it back, and check every group's guards
    and slot mappings. `written`: each scheduled request's length after the step."""
    back = None
    try:
        held, rows, read_positions = planned_reads(state, written)
        # One upload for the values every group writes and the reads every group makes.
        sent, sent_reads = upload_arrays([values, Reads.packed(rows, read_positions)], state.backend)
        calls, pairs = launch_groups(state, qsl, positions, sent, N)
        expected = expected_slots(state, qsl, positions)  # on the host while the device works
        kv = state.kv.launch(calls, pairs, qsl, positions, values, written, expected) if state.kv is not None else []
        v2 = state.v2.launch(qsl, positions, values, N, N_pad, pairs, written) if state.v2 is not None else []
        reads = launch_reads(state, held, Reads.received(rows, read_positions, sent_reads))
        back = ReadBack.fetch(tables=[table.device_tensor for table in state.impl.tables.tables],
                              handed=[call.readback()[0] for call in calls],
                              padded=[rows for _, _, rows in padded], reads=reads.tensors, kv=kv, v2=v2)
        for g, call in enumerate(calls):
            check_group(state, g, call, [back.handed[g], back.tables[g]], qsl, positions, N, expected[g])
    except Discrepancy:
        check_padded(padded, back.padded if back is not None else None)
        raise
    return back, reads


def launch_groups(state: State, qsl: np.ndarray, positions: np.ndarray, values: torch.Tensor,
                  N: int) -> tuple[list[StagedCall | ClassSlotCall], list[list[tuple[int, int]]]]:
    """Every group's kernel calls, then its copy-on-write copies and the writes of the
    step's values through the slot mappings the kernel returned. The writes are not
    checked on their own (a device sync each): every slot is compared with the
    reference's before the data read back is, which is the clearer report, and a
    wrong slot is skipped or lands in a wrong place, never outside the cache."""
    pairs = []
    for g in range(len(state.layouts)):
        ref_pairs, impl_pairs = state.reference.seqs[g].take_cow_pairs(), state.impl.seqs[g].take_cow_pairs()
        if ref_pairs != impl_pairs:
            raise Discrepancy("copy-on-write pairs", f"expected {ref_pairs}, got {impl_pairs}", group=g)
        pairs.append(ref_pairs)
    calls: list[StagedCall | ClassSlotCall]
    tables = state.impl.tables
    if isinstance(tables, DrivenTables):  # the table class computes its own (docs/contract.md §11)
        calls = list(tables.slot_calls(qsl, positions, N, [lay.world for lay in state.layouts]))
    else:
        calls = [slot_calls(state, g, qsl, positions, N, range(lay.world)) for g, lay in enumerate(state.layouts)]
    for g, call in enumerate(calls):
        cache, offset = state.caches[g], state.world.id_offset
        cache.copy_blocks([(s + offset, d + offset) for s, d in pairs[g]], state.layouts[g].kv_block_size)
        cache.write(call.outputs, values, check=False)
    return calls, pairs


def check_group(state: State, g: int, call: StagedCall | ClassSlotCall, back: list[np.ndarray], qsl: np.ndarray,
                positions: np.ndarray, N: int, expected: np.ndarray) -> None:
    """Group g's guards and inputs as they were (else: whose call broke them, each
    rank alone), and its slot mappings against the reference's (`expected`, every
    rank's: expected_slots)."""
    try:
        actual = call.check(back)
    except Discrepancy:
        alone = isinstance(call, StagedCall) and state.layouts[g].world > 1
        for R in range(state.layouts[g].world if alone else 0):
            slot_calls(state, g, qsl, positions, N, [R]).check()
        raise
    compare_slots(state, g, qsl, positions, N, actual, back[1], expected)


def slot_config(state: State, g: int) -> dict[str, int]:
    lay = state.layouts[g]
    return dict(kv_block_size=lay.kv_block_size, kernel_block_size=lay.kernel_block_size, cp_world_size=lay.world,
                cp_interleave=lay.interleave)


def expected_slots(state: State, qsl: np.ndarray, positions: np.ndarray) -> list[np.ndarray]:
    """Every group's slot mappings on every rank ([W, Tmax] each), by the reference,
    through the reference's committed table: what the step's calls must return, and
    where its KV writes land."""
    return [reference_slot_mappings(qsl, positions, state.reference.tables[g].device,
                                    state.world.max_num_batched_tokens, **slot_config(state, g))
            for g in range(len(state.layouts))]


def compare_slots(state: State, g: int, qsl: np.ndarray, positions: np.ndarray, N: int,
                  actual: np.ndarray, impl_rows: np.ndarray, every_rank: np.ndarray) -> None:
    """Group g's slot mapping of every rank (whole [Tmax] outputs) against the
    reference's (`every_rank`). `impl_rows`: the implementation's device table, for
    the report."""
    kw = slot_config(state, g)
    W = kw["cp_world_size"]
    for R in range(W):
        expected = every_rank[R]
        check_slot_mapping("slot mapping", expected, actual[R], group=g, rank=R, config=dict(cp_rank=R, **kw),
                           query_start_loc=qsl, positions=positions, table=state.reference.tables[g].device,
                           requests=state.rows[:N], impl_table=impl_rows,
                           counts=(state.reference.tables[g].count, state.impl.tables[g].count))
        if W > 1 and len(positions) and (expected[:len(positions)] < 0).any():
            state.event(events.NON_LOCAL_DCP)


def slot_calls(state: State, g: int, qsl: np.ndarray, positions: np.ndarray, N: int,
               ranks: Iterable[int]) -> StagedCall:
    """The kernel under test on group g's committed table for each of `ranks`, all on
    one set of guarded inputs, each into its own guarded output. The guards are
    the caller's to check (every group's together: one device sync per step)."""
    ranks = list(ranks)
    kw = slot_config(state, g)
    call = StagedCall(state.impl.tables[g].device_tensor, qsl, positions, state.world.max_num_batched_tokens,
                      group=g, ranks=tuple(ranks), slot=g)
    qsl_view, pos_view, table_view = call.inputs()
    for i, R in enumerate(ranks):
        out = call.output(i)
        handed = Handed.of(SLOT_MAPPING, (qsl_view, pos_view, table_view, out))
        try:
            # Our wrappers' data checks read query_start_loc and positions back (a
            # device sync). The harness's are valid by construction; the stateless
            # fuzzer runs the checks on every batch it draws and the unit tests on
            # invalid ones, so here they run on a program's first call only.
            with data_checks(state.steps_checked == 0 and g == 0 and i == 0):
                state.kernels.slot(qsl_view, pos_view, table_view, out, cp_rank=R, **kw)
        except Exception as e:  # a kernel that refuses valid input is wrong too
            raise Discrepancy("slot mapping", f"the kernel raised {type(e).__name__}: {e}", group=g, rank=R) from e
        handed.check("slot mapping", group=g, rank=R)  # before the KV writes and the read-back use it
    return call


def check_padded(padded: Padded, back: list[np.ndarray] | None = None) -> None:
    """The rows each group's pad_for_cuda_graph returned against the reference's;
    `back`: those rows already on the host (else read here)."""
    back = to_host([rows for _, _, rows in padded]) if back is None else back
    for (g, expected, _), rows in zip(padded, back):
        assert_arrays_equal("padded table", expected, rows, group=g)


def planned_reads(state: State, written: dict[int, int],
                  row_of: Callable[[int], int] | None = None) -> tuple[list[tuple[int, int]], np.ndarray, np.ndarray]:
    """The contract's §7 read-back of a step, on the host: every live sequence's
    positions 0 .. its length after this step (`written`, for the requests that
    computed tokens), as (request, length) of each sequence read and the row and
    position of each read. `row_of(request)`: the row it is read at (by default its
    row of the table; a V2 world reads at its batch position)."""
    held = [(rid, written.get(rid, state.requests[rid].written)) for rid in state.live()]
    held = [(rid, n) for rid, n in held if n]
    if not held:
        return held, np.zeros(0, np.int32), np.zeros(0, np.int64)
    counts = np.array([n for _, n in held])
    where = [state.requests[rid].row if row_of is None else row_of(rid) for rid, _ in held]
    rows = np.repeat(np.array(where, dtype=np.int32), counts)
    # Each request's positions 0 .. n-1, all requests end to end.
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return held, rows, np.arange(len(rows), dtype=np.int64) - starts


def launch_reads(state: State, held: list[tuple[int, int]], sent: Reads) -> LaunchedReads:
    """The planned reads (planned_reads, already sent), launched through each group's
    device table on every rank."""
    if not held:
        return LaunchedReads(held, sent.rows, sent.positions, [])
    tensors = [state.caches[g].read(state.impl.tables[g].device_tensor, sent, **slot_config(state, g))
               for g in range(len(state.layouts))]
    return LaunchedReads(held, sent.rows, sent.positions, tensors)


def compare_reads(state: State, reads: LaunchedReads, back: list[np.ndarray]) -> None:
    """Every live sequence, read through each group's device table on every rank,
    equals its history; each token is held by exactly one rank."""
    if not reads.held:
        return
    want = np.concatenate([np.array(state.history[rid][:n], dtype=np.int64) for rid, n in reads.held])
    poison = poison_value()
    for g, got in enumerate(back):
        ranks = (got != poison).sum(axis=0)
        if (ranks != 1).any():
            i = int(np.argmax(ranks != 1))
            raise Discrepancy("data read-back", f"position {reads.positions[i]} of request "
                                                f"{state.rows[reads.rows[i]]} is held by {ranks[i]} ranks", group=g)
        merged = np.where(got != poison, got, 0).sum(axis=0)
        if not same_values(merged, want):
            i = int(np.argmax(merged != want))
            raise Discrepancy("data read-back",
                              f"request {state.rows[reads.rows[i]]} position {reads.positions[i]}: expected value "
                              f"{want[i]}, read {merged[i]} ({int((merged != want).sum())} of {len(want)} "
                              f"values differ)", group=g)
