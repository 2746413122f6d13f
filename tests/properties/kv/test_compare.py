"""The KV comparisons (properties/kv_compare.py): one planted difference anywhere in a
cache decodes to its block, offset, slot, head and dim in both layouts; NaNs compare
by bits, except an fp8 cache's two NaN codes and the NaNs a gather decodes (unless
strict); equal caches pass."""

import numpy as np
import pytest

from blocktable.properties.compare import Discrepancy
from blocktable.properties.kv.compare import NAN_NOTE, compare_cache, compare_gathered, element_text
from blocktable.reference.kv import cache_shape, entry

DTYPES = [np.float16, np.uint16, np.float32, np.uint8]  # uint16: bfloat16 bits; uint8: fp8 codes


def random_cache(rng, shape, dtype):
    bits = rng.integers(0, 256, (*shape, np.dtype(dtype).itemsize), dtype=np.uint8)
    return bits.view(dtype).reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_a_planted_difference_decodes_to_its_place(layout, dtype):
    rng = np.random.default_rng(1)
    Bk, H, D = 3, 2, 5
    expected = random_cache(rng, cache_shape(layout, 4, Bk, H, D), dtype)
    compare_cache("key cache", expected, expected.copy(), layout=layout, block_size=Bk)
    for block, offset, head, dim in [(0, 0, 0, 0), (2, 1, 1, 3), (3, 2, 1, 4)]:
        actual = expected.copy()
        place = entry(actual, layout, block, offset)
        place.view(np.uint8).reshape(H, D, -1)[head, dim, 0] ^= 1  # one bit of one element
        with pytest.raises(Discrepancy) as caught:
            compare_cache("key cache", expected, actual, layout=layout, block_size=Bk,
                          owners=lambda slot: f"token {slot + 100}")
        error = caught.value
        assert error.index == (block, offset, head, dim)
        slot = block * Bk + offset
        text = str(error)
        assert text.startswith("key cache: 1 of 120 elements differ")
        assert f"block {block}, offset {offset} (slot {slot}; token {slot + 100}), head {head}, dim {dim}" in text
        want = entry(expected, layout, block, offset)[head, dim]
        assert f"expected {element_text(want)}" in text


def test_values_are_shown_as_numbers_and_bits():
    assert element_text(np.float16(1.5)) == "1.5 (0x3e00)"
    assert element_text(np.uint16(0x3FC0)) == "1.5 (0x3fc0)"  # bfloat16 bits
    assert element_text(np.float32(-2.0)) == "-2.0 (0xc0000000)"
    assert element_text(np.uint8(0x7E)) == "code 0x7e = 448.0"
    assert element_text(np.uint8(0xFF)) == "code 0xff = nan"


def test_nans_compare_by_their_bits():
    expected = np.full((1, 2, 1, 2), np.nan, dtype=np.float32)
    same = expected.copy()
    compare_cache("value cache", expected, same, layout="NHD", block_size=2)  # one NaN, same bits: equal
    other = expected.copy()
    other.view(np.uint32)[0, 1, 0, 1] |= np.uint32(0x80000000)  # -NaN
    with pytest.raises(Discrepancy, match=r"offset 1 \(slot 1\), head 0, dim 1: expected nan \(0x7fc00000\), "
                                          r"got nan \(0xffc00000\)"):
        compare_cache("value cache", expected, other, layout="NHD", block_size=2)
    zero = np.zeros((1, 1, 1, 1), np.float16)
    with pytest.raises(Discrepancy, match="0x8000"):
        compare_cache("key cache", zero, -zero, layout="HND", block_size=1)


def test_an_fp8_cache_may_hold_either_nan_code_and_strict_says_so():
    """docs/contract.md §9: 0x7F and 0xFF are both e4m3fn NaN, and nothing reading the
    cache tells them apart; only an fp8 cache is allowed this (a float cache's NaN
    is a bit copy, above)."""
    expected = np.array([0x7F, 0x7F, 0x10, 0xFF], dtype=np.uint8).reshape(1, 2, 1, 2)
    actual = np.array([0xFF, 0x7F, 0x10, 0x7F], dtype=np.uint8).reshape(1, 2, 1, 2)
    compare_cache("key cache", expected, actual, layout="NHD", block_size=2)
    with pytest.raises(Discrepancy) as caught:
        compare_cache("key cache", expected, actual, layout="NHD", block_size=2, strict_nan=True)
    assert NAN_NOTE in caught.value.notes and "2 of 4 elements differ" in str(caught.value)
    numbered = actual.copy()
    numbered[0, 0, 0, 0] = 0x00  # a NaN turned into a number: a finding either way
    for strict in (False, True):
        with pytest.raises(Discrepancy) as caught:
            compare_cache("key cache", expected, numbered, layout="NHD", block_size=2, strict_nan=strict)
        assert NAN_NOTE not in caught.value.notes and "expected code 0x7f = nan, got code 0x00 = 0.0" in str(caught.value)


def test_decoded_rows_may_hold_any_nan_but_rows_past_them_keep_their_bits():
    nan = np.uint32(0x7FC00000)
    expected = np.full((3, 1, 2), nan, dtype=np.uint32)
    actual = expected.copy()
    actual[0, 0, 0] = 0x7FF00000  # torch's decode keeps the code's payload
    actual[1, 0, 1] = 0xFFFFFFFF  # a negative NaN with every payload bit
    expected, actual = expected.view(np.float32), actual.view(np.float32)
    compare_gathered("key rows", expected, actual, nan_rows=2)
    with pytest.raises(Discrepancy) as caught:
        compare_gathered("key rows", expected, actual, nan_rows=2, strict_nan=True)
    assert NAN_NOTE in caught.value.notes
    past = actual.copy()
    past.view(np.uint32)[2, 0, 0] = 0x7FF00000  # row 2 is padding (past cu_lens[N]): bit for bit
    with pytest.raises(Discrepancy, match="first at row 2") as caught:
        compare_gathered("key rows", expected, past, nan_rows=2)
    assert NAN_NOTE not in caught.value.notes


def test_counts_and_blocks_of_several_differences():
    expected = np.zeros((6, 2, 1, 1), np.uint8)
    actual = expected.copy()
    actual[1, 1] = 3
    actual[4, 0] = 0x7F
    with pytest.raises(Discrepancy, match=r"2 of 12 elements differ \(in blocks 1, 4\); first at block 1, offset 1 "
                                          r"\(slot 3\), head 0, dim 0: expected code 0x00 = 0.0, got code 0x03"):
        compare_cache("key cache", expected, actual, layout="NHD", block_size=2)


def test_shape_dtype_and_block_size_mismatches():
    a = np.zeros((2, 3, 1, 4), np.float16)
    with pytest.raises(Discrepancy, match="shape"):
        compare_cache("c", a, a[:1], layout="NHD", block_size=3)
    with pytest.raises(Discrepancy, match="dtype"):
        compare_cache("c", a, a.view(np.uint16), layout="NHD", block_size=3)
    with pytest.raises(ValueError, match="block_size 2"):
        compare_cache("c", a, a, layout="NHD", block_size=2)


@pytest.mark.parametrize("dtype", DTYPES[:3])
def test_gathered_rows_decode_to_row_head_dim(dtype):
    rng = np.random.default_rng(2)
    expected = random_cache(rng, (7, 3, 4), dtype)
    compare_gathered("out_key", expected, expected.copy())
    actual = expected.copy()
    actual.view(np.uint8).reshape(7, 3, 4, -1)[5, 2, 1, -1] ^= 0x80  # the sign bit
    with pytest.raises(Discrepancy) as caught:
        compare_gathered("out_key", expected, actual, rows=lambda i: f"request 2 local index {i - 4}")
    assert caught.value.index == (5, 2, 1)
    text = str(caught.value)
    assert "1 of 84 elements differ (in rows 5); first at row 5 (request 2 local index 1), head 2, dim 1" in text
