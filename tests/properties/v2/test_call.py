"""One V2 block-table call run behind guards (properties/v2/): correct kernels pass;
kernels that break one promise of docs/plugins.md each fail with the element decoded
(a write outside the interior, into an input, a stale column lost, a row past
num_reqs_padded, the pad from the wrong token, an int32 product, no column guard, the
earlier write winning, rows indexed as if contiguous); shrinking finds the one
failing write, request or token; the draws reach what they promise; the schema
refuses what cannot be replayed."""

import copy

import numpy as np
import pytest
import torch

from blocktable import device
from blocktable.properties.cases.case import Case, CaseError
from blocktable.properties.v2.call import check_call, run_v2_call, stride
from blocktable.properties.v2.compare import V2Element
from blocktable.properties.v2.draw import INTERPRETED, Limits, draw, shrink
from blocktable.properties.v2.truth import before, plan
from blocktable.v2 import TRITON_KERNELS
from blocktable.v2_torch import append_torch, gather_torch, slot_mappings_torch

DEVICE = device.current().device
OURS = {"append": append_torch, "gather": gather_torch, "slots": slot_mappings_torch}
SMALL = Limits(max_num_reqs=16, max_width=16, max_tokens=64, max_requests=8)


def calls(op, count, seed=5, limits=INTERPRETED):
    rng = np.random.default_rng(seed)
    return [draw(op, rng, limits) for _ in range(count)]


def first_failure(op, kernel, count=80, seed=5):
    for call in calls(op, count, seed):
        outcome = run_v2_call(call, kernel, DEVICE)
        if not outcome.passed:
            return call, outcome.error
    raise AssertionError(f"no call of {count} caught the kernel")


@pytest.mark.parametrize("op", ["append", "gather", "slots"])
def test_the_torch_kernels_pass_every_call(op):
    for call in calls(op, 40):
        outcome = run_v2_call(call, OURS[op], DEVICE)
        assert outcome.passed, outcome.error


@pytest.mark.parametrize("op", ["append", "gather", "slots"])
def test_our_triton_kernels_pass_small_calls(op):
    kernel = {"append": TRITON_KERNELS.append, "gather": TRITON_KERNELS.gather,
              "slots": TRITON_KERNELS.slot_mappings}[op]
    for call in calls(op, 4, seed=2, limits=SMALL):
        outcome = run_v2_call(call, kernel, DEVICE)
        assert outcome.passed, outcome.error


def test_the_expected_state_is_the_references_and_the_call_is_deterministic():
    call = calls("append", 1, seed=11)[0]
    first, second = plan(call), plan(copy.deepcopy(call))
    for a, b in zip(first.after.rows, second.after.rows):
        assert np.array_equal(a, b)
    assert np.array_equal(first.after.cnt_dev, first.inputs["cnt"])  # the apply's snapshot of the host counts
    assert np.array_equal(before(call).rows[0], first.before.rows[0])


def test_a_write_outside_the_interior_hits_the_guard():
    def stray(rows, cnt_dev, cnt, *staged):
        append_torch(rows, cnt_dev, cnt, *staged)
        t = rows[0]
        torch.as_strided(t, (1,), (1,), t.storage_offset() + t.shape[1]).fill_(7)  # one past row 0's end

    call, error = first_failure("append", stray)
    layout = call["layout"]
    width = call["config"]["max_num_blocks_per_group"][0] * (call["config"]["block_sizes"][0]
                                                             // call["config"]["kernel_block_sizes"][0])
    assert stride(width, layout) > width  # only a row stride past the width has a cell there
    assert "guard" in error.what and "the kernel wrote outside its tensors" in str(error)


def test_a_kernel_that_changes_an_input_is_caught():
    def scribble(rows, cnt_dev, inp, idx_mapping, num_reqs_padded):
        gather_torch(rows, cnt_dev, inp, idx_mapping, num_reqs_padded)
        rows[0][0, 0] += 1

    _, error = first_failure("gather", scribble)
    assert "the kernel wrote into an input" in str(error) and "rows 0" in str(error)


def test_a_gather_that_zeroes_the_stale_columns_is_caught():
    def zero_tail(rows, cnt_dev, inp, idx_mapping, num_reqs_padded):
        for out in inp:
            out[:num_reqs_padded] = 0
        gather_torch(rows, cnt_dev, inp, idx_mapping, num_reqs_padded)

    _, error = first_failure("gather", zero_tail)
    assert isinstance(error.detail, V2Element) and error.detail.buffer == "inp"
    assert "stale" in error.detail.why and "keeps what it held" in error.detail.why


def test_a_gather_that_pads_every_row_is_caught():
    def pads_all(rows, cnt_dev, inp, idx_mapping, num_reqs_padded):
        gather_torch(rows, cnt_dev, inp, idx_mapping, inp[0].shape[0])

    call, error = first_failure("gather", pads_all)
    assert call["num_reqs_padded"] < call["config"]["max_num_reqs"]
    assert "past num_reqs_padded" in error.detail.why and error.detail.batch >= call["num_reqs_padded"]


def test_the_pad_from_num_tokens_padded_is_caught():
    """vLLM #36580: the pad starts at the real token count T, not the padded one."""
    def pads_late(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **kw):
        keep = slots.clone()
        slot_mappings_torch(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **kw)
        T = int(query_start_loc[idx_mapping.numel()])
        slots[:, T:num_tokens_padded] = keep[:, T:num_tokens_padded]

    call, error = first_failure("slots", pads_late)
    assert "the pad" in error.detail.why and error.detail.token is not None


def test_an_int32_slot_product_is_caught():
    def int32(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **kw):
        slot_mappings_torch(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **kw)
        slots.copy_(slots.to(torch.int32).to(torch.int64))  # what an int32 product keeps

    _, error = first_failure("slots", int32)
    d = error.detail
    assert d.buffer == "slots" and d.expected > 2**31 - 1 and "kernel block id" in d.why


def test_no_column_guard_is_caught():
    """vLLM #53982, #54296: a column past the row must give -1, not the next row's entry."""
    def unguarded(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **kw):
        wide = [torch.as_strided(t, (t.shape[0], t.shape[1] + 64), t.stride()) for t in rows]
        slot_mappings_torch(wide, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **kw)

    _, error = first_failure("slots", unguarded)
    assert "past the row" in error.detail.why and error.detail.expected == -1


def test_the_earlier_write_winning_is_caught():
    def reversed_order(rows, cnt_dev, cnt, group, row, start, ids, cu):
        S = group.numel()
        for i in reversed(range(S)):
            g, r, s = int(group[i]), int(row[i]), int(start[i])
            chunk = ids[int(cu[i]):int(cu[i + 1])]
            rows[g][r, s:s + chunk.numel()] = chunk
        cnt_dev.copy_(cnt)

    call, error = first_failure("append", reversed_order)
    assert "the later one wins" in error.detail.why
    small = shrink(call, error, reversed_order, DEVICE)
    assert len(small["appends"]) == 2 and len(small["config"]["block_sizes"]) == 1, small


def test_rows_indexed_as_if_contiguous_are_caught():
    """docs/plugins.md: rows may be the interior of a larger buffer; index with stride(0)."""
    def contiguous(rows, cnt_dev, inp, idx_mapping, num_reqs_padded):
        flat = [torch.as_strided(t, t.shape, (t.shape[1], 1)) for t in inp]
        gather_torch(rows, cnt_dev, flat, idx_mapping, num_reqs_padded)

    call, error = first_failure("gather", contiguous)
    assert call["layout"]["lead_cols"] + call["layout"]["pad"] > 0 or call["layout"]["aligned"]


def test_a_wrong_batch_row_decodes_and_shrinks_to_one_request():
    def by_batch_index(rows, cnt_dev, inp, idx_mapping, num_reqs_padded):
        fake = torch.where(idx_mapping >= 0, torch.arange(idx_mapping.numel(), device=idx_mapping.device), -1)
        gather_torch(rows, cnt_dev, inp, fake.to(idx_mapping.dtype), num_reqs_padded)

    call, error = first_failure("gather", by_batch_index)
    d = error.detail
    assert d.buffer == "inp" and d.slot == call["idx_mapping"][d.batch] and d.slot != d.batch
    small = shrink(call, error, by_batch_index, DEVICE)
    assert len(small["idx_mapping"]) == 1 and len(small["config"]["block_sizes"]) == 1, small
    assert not run_v2_call(small, by_batch_index, DEVICE).passed


def test_a_wrong_slot_shrinks_to_one_token():
    def off_by_one(rows, idx_mapping, query_start_loc, positions, slots, num_tokens_padded, **kw):
        slot_mappings_torch(rows, idx_mapping, query_start_loc, positions + 1, slots, num_tokens_padded, **kw)

    call, error = first_failure("slots", off_by_one)
    small = shrink(call, error, off_by_one, DEVICE)
    N = len(small["idx_mapping"])
    assert N == 1 and small["query_start_loc"][1] == 1, small
    assert small["positions"][0] in call["positions"]


def test_the_draws_reach_what_they_promise():
    seen = set()
    for op in ("append", "gather", "slots"):
        for call in calls(op, 150, seed=1):
            c = call["config"]
            P = [k // b for k, b in zip(c["block_sizes"], c["kernel_block_sizes"])]
            layout = call["layout"]
            seen.add(f"groups {len(P)}")
            if max(P) > 1:
                seen.add("hybrid")
            if c["cp_size"] > 1 and any(s and p > 1 and c["cp_interleave"] > b for s, p, b in
                                        zip(c["dcp_sharded"], P, c["kernel_block_sizes"])):
                seen.add("ownership differs from kernel-block coordinates")
            if layout["lead_cols"] + layout["pad"] or layout["lead_rows"]:
                seen.add("strided")
            if op == "append":
                appends = call["appends"]
                if any(a["overwrite"] for a in appends):
                    seen.add("overwrite")
                slots = [a["slot"] for a in appends]
                if len(slots) > len(set(slots)):
                    seen.add("several writes to one slot")
                planned = plan(call)
                for i, (g, r, s, ids) in enumerate(planned.staged):
                    if any(g2 == g and r2 == r and s2 < s + len(ids) and s < s2 + len(ids2)
                           for g2, r2, s2, ids2 in planned.staged[i + 1:]):
                        seen.add("overlapping writes")
                    if s + len(ids) == planned.before.rows[g].shape[1]:
                        seen.add("a write to the row's end")
                    if max(ids) >= 2**31 - 8:
                        seen.add("ids near 2**31-1")
            else:
                idx = call["idx_mapping"]
                if -1 in idx:
                    seen.add(f"{op}: dummies")
                real = [r for r in idx if r >= 0]
                if len(real) > len(set(real)):
                    seen.add(f"{op}: duplicates")
            if op == "gather" and call["num_reqs_padded"] > len(call["idx_mapping"]):
                seen.add("gather: padding")
            if op == "slots":
                N = len(call["idx_mapping"])
                T = call["query_start_loc"][N]
                if len(call["query_start_loc"]) > N + 1 and len(call["positions"]) > T:
                    seen.add("slots: entries past N and T")
                if call["num_tokens_padded"] > T:
                    seen.add("slots: a tail")
                width = [m * p for m, p in zip(c["max_num_blocks_per_group"], P)]
                if any(p // c["kernel_block_sizes"][0] >= width[0] for p in call["positions"][:T]):
                    seen.add("slots: positions past the row")
    expected = {"groups 1", "groups 4", "hybrid", "ownership differs from kernel-block coordinates", "strided",
                "overwrite", "several writes to one slot", "overlapping writes", "a write to the row's end",
                "ids near 2**31-1", "gather: dummies", "gather: duplicates", "gather: padding", "slots: dummies",
                "slots: duplicates", "slots: entries past N and T", "slots: a tail", "slots: positions past the row"}
    assert expected <= seen, expected - seen


def test_the_schema_refuses_what_cannot_be_replayed():
    good = calls("slots", 1, seed=4)[0]
    assert check_call(copy.deepcopy(good)) == good

    def broken(change):
        call = copy.deepcopy(good)
        change(call)
        with pytest.raises(ValueError, match="^call: ") as caught:
            check_call(call)
        return str(caught.value)

    assert "'op' is missing" in broken(lambda c: c.pop("op"))
    assert "not a valid V2 configuration" in broken(lambda c: c["config"].update(kernel_block_sizes=[
        k + 1 for k in c["config"]["block_sizes"]]))
    assert "'group_seeds' must be" in broken(lambda c: c["group_seeds"].append(1))
    assert "'aligned' must be" in broken(lambda c: c["layout"].pop("aligned") and None or c["layout"].update(
        aligned=1))
    assert "the reference refuses it" in broken(lambda c: c.update(idx_mapping=[c["config"]["max_num_reqs"]]))
    assert "the reference refuses it" in broken(lambda c: c.update(query_start_loc=[1, 2]))
    data = Case("v2-call", "torch", {}, call=good).to_json()
    data["call"]["num_tokens_padded"] = "many"
    with pytest.raises(CaseError, match="case file: call: 'num_tokens_padded' must be an integer"):
        Case.from_json(data)
