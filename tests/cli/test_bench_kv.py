"""The KV benchmark's code path on tiny shapes (under the interpreter on a CPU): every
case runs both implementations, finds them equal, and reports; a wrong
implementation is reported and not timed."""

from unittest import mock

from blocktable import kv_torch
from blocktable.cli import bench_kv


def test_the_tiny_suite_runs_and_agrees(backend):
    rows, copy_gbps = bench_kv.run_suite(backend, bench_kv.TINY_CASES)
    assert [(r.case, r.kernel) for r in rows[:2]] == [(bench_kv.TINY_CASES[0].name(), "triton"),
                                                      (bench_kv.TINY_CASES[0].name(), "torch")]
    assert len(rows) == 2 * len(bench_kv.TINY_CASES)
    assert all(r.ok and r.microseconds is not None and r.bytes > 0 for r in rows)
    text = bench_kv.render_markdown(rows, copy_gbps, backend.describe())
    assert text.count("\n| ") == len(rows) + 2  # the header, its rule and one line a row
    if backend.interpreted:
        assert copy_gbps is None and "not timings" in text


def test_a_wrong_implementation_is_reported_not_timed(backend):
    case = bench_kv.Case("write", 8, heads=2, head_size=8, block_size=4)
    with mock.patch.object(kv_torch, "write_torch", lambda *args, **kw: None):  # writes nothing
        rows = bench_kv.bench_case(case, backend)
    # Ours (checked against the reference by the test suite) is timed; the one that
    # differs from it is not.
    assert [(r.kernel, r.ok, r.microseconds is None) for r in rows] == [("triton", True, False), ("torch", False, True)]
    assert "OUTPUTS DIFFER (torch vs triton): not timed" in bench_kv.render_markdown(rows, None, backend.describe())


def test_byte_counts_are_the_minimum_traffic():
    """Inputs read once, outputs written once, for key and value, plus the ids."""
    tiny = dict(heads=2, head_size=8, block_size=4)
    # write: 16 tokens x 2 x 8 bf16 in and out (2 + 2 bytes), twice, plus 16 int64 slots.
    assert bench_kv.prepare(bench_kv.Case("write", 16, **tiny), "cpu").bytes == 2 * 16 * 16 * 4 + 8 * 16
    # copy: 4 pairs x 2 layers x 2 caches, a 4 x 2 x 8 bf16 block read and written, plus the pairs.
    assert bench_kv.prepare(bench_kv.Case("copy", 4, layers=2, **tiny), "cpu").bytes == 2 * 4 * 4 * 64 * 2 + 16 * 4
    # gather: 12 fp8 entries of 2 x 8 read (1 byte) and written as float32 (4), twice; a
    # 3 x 1 table and 4 cu_lens (int32).
    case = bench_kv.Case("gather", 12, requests=3, kv_cache_dtype="fp8_e4m3", **tiny)
    assert bench_kv.prepare(case, "cpu").bytes == 2 * 12 * 16 * 5 + 4 * (3 + 4)
    assert case.name() == "gather 3 x 4 tokens, 2x8 fp8 NHD"


def test_nan_encodings_differ_only_where_the_contract_allows():
    import torch

    a = torch.tensor([0x7F, 0x7F, 0x10], dtype=torch.uint8)
    b = torch.tensor([0xFF, 0xFF, 0x10], dtype=torch.uint8)
    inside = torch.tensor([True, True, True])
    assert bench_kv.same_outputs(a, b, inside)
    assert not bench_kv.same_outputs(a, b, inside, strict_nan=True)
    assert not bench_kv.same_outputs(a, b, torch.tensor([True, False, True]))  # one NaN code outside the cells
    assert not bench_kv.same_outputs(a, b, None)  # a bit copy (copy_blocks, a bf16 cache)
    nan, other_nan = (torch.tensor([bits], dtype=torch.int32).view(torch.float32) for bits in (0x7FC00000, 0x7FF00000))
    assert bench_kv.same_outputs(nan, other_nan, torch.tensor([True]))
    assert not bench_kv.same_outputs(nan, torch.zeros(1), torch.tensor([True]))


def test_a_gather_decoding_nans_its_own_way_is_timed_unless_strict(backend):
    """The poisoned fp8 caches hold NaN codes; torch's decode keeps their payloads."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "torch_kv_gather.py"
    spec = importlib.util.spec_from_file_location("torch_kv_gather", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    case = bench_kv.Case("gather", 12, requests=3, kv_cache_dtype="fp8_e4m3", heads=2, head_size=8, block_size=4)
    extra = {"example": module.gather}
    assert [r.ok for r in bench_kv.bench_case(case, backend, extra=extra)] == [True, True, True]
    strict = bench_kv.bench_case(case, backend, extra=extra, strict_nan=True)
    assert [(r.kernel, r.ok) for r in strict] == [("triton", True), ("torch", True), ("example", False)]
