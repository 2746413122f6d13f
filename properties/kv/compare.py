"""Bit-for-bit comparisons of KV caches and gathered rows (docs/contract.md §9), each
failing with a message that decodes the first differing element in the cache's
terms: block, offset, slot, head and dim (or row, head and dim), both values as
numbers and as bits (fp8 codes decoded too), and who owns the place.

Arrays follow blocktable.reference.kv's conventions: float16 and float32 as they
are, bfloat16 as uint16 bit patterns, fp8 e4m3 caches as uint8 codes. Values are
compared as raw bits (unsigned integers of the item size): -0.0 is not 0.0, and a
NaN equals only the same NaN, except where docs/contract.md §9 lets the encoding of
a NaN differ (`nans=True`): an fp8 cache may hold either of e4m3fn's two NaN codes,
and a decoded fp8 value may be any NaN. `--strict-nan` keeps them exact; a
difference that is only a NaN encoding then says so.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from blocktable.properties.compare import Discrepancy
from blocktable.properties.kv.data import UNSIGNED
from blocktable.reference.fp8 import bfloat16_to_float32, decode_e4m3


class CacheDiscrepancy(Discrepancy):
    """A cache differs; the first differing element decoded: block, offset, slot =
    block * Bk + offset, head and dim."""

    def __init__(self, part: str, message: str, *, block: int, offset: int, slot: int, head: int, dim: int,
                 expected: object, actual: object) -> None:
        super().__init__(part, message, index=(block, offset, head, dim), expected=expected, actual=actual)
        self.block, self.offset, self.slot, self.head, self.dim = block, offset, slot, head, dim


class RowsDiscrepancy(Discrepancy):
    """A gather's output differs; the first differing element decoded: row, head, dim."""

    def __init__(self, part: str, message: str, *, row: int, head: int, dim: int, expected: object,
                 actual: object) -> None:
        super().__init__(part, message, index=(row, head, dim), expected=expected, actual=actual)
        self.row, self.head, self.dim = row, head, dim


def raw_bits(a: np.ndarray) -> np.ndarray:
    """`a`'s memory as unsigned integers of its item size (any strides)."""
    a = np.asarray(a)
    return a.view(UNSIGNED[a.dtype.itemsize])


def element_text(value: np.ndarray) -> str:
    """One element as a number and its bits: `1.5 (0x3e00)`; an fp8 code as
    `code 0x7e = 448.0`; bfloat16 (uint16) decoded from its bits."""
    value = np.asarray(value)
    width = 2 * value.dtype.itemsize
    code = int(raw_bits(value.reshape(1))[0])
    if value.dtype == np.uint8:
        return f"code {code:#04x} = {float(decode_e4m3(value.reshape(1))[0])!r}"
    if value.dtype == np.uint16:
        number = float(bfloat16_to_float32(value.reshape(1))[0])
    else:
        number = float(value)
    return f"{number!r} ({code:#0{width + 2}x})"


FP8_NAN_CODES = (0x7F, 0xFF)  # e4m3fn's only NaNs: no reader can tell them apart
NAN_NOTE = "the difference is only a NaN encoding (both are NaN); --strict-nan asks for the exact bits"


def both_nan(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
    """Where both arrays hold a NaN: an fp8 NaN code in uint8 (fp8) arrays, a float
    NaN in float ones (uint16: bfloat16 bits)."""
    if expected.dtype == np.uint8:
        return np.isin(expected, FP8_NAN_CODES) & np.isin(actual, FP8_NAN_CODES)
    if expected.dtype == np.uint16:
        return np.isnan(bfloat16_to_float32(expected)) & np.isnan(bfloat16_to_float32(actual))
    if expected.dtype.kind != "f":
        return np.zeros(expected.shape, dtype=bool)  # integers: no NaN
    return np.isnan(expected) & np.isnan(actual)


def differing(expected: np.ndarray, actual: np.ndarray, nans: bool | np.ndarray,
              strict: bool = False) -> tuple[np.ndarray, bool]:
    """(where the bits differ, NaNs of two encodings counted equal where the contract
    allows it, `nans` (everywhere, or a mask), unless `strict`; whether, strict, every
    difference is only such a NaN encoding)."""
    differ = raw_bits(expected) != raw_bits(actual)
    if not differ.any() or not np.any(nans):
        return differ, False
    allowed = differ & both_nan(expected, actual) & nans
    if strict:
        return differ, bool(allowed.sum() == differ.sum())
    return differ & ~allowed, False


def _mismatch(what: str, expected: np.ndarray, actual: np.ndarray, dims: int,
              nans: bool | np.ndarray = False, strict: bool = False) -> tuple[np.ndarray, list[str]] | None:
    """The differing positions (np.argwhere order) and the notes on them, or None
    when equal; raises on a shape or dtype mismatch."""
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.ndim != dims:
        raise ValueError(f"{what}: expected a {dims}-D array, got shape {expected.shape}")
    if expected.shape != actual.shape:
        raise Discrepancy(what, f"shape {actual.shape}, expected {expected.shape}")
    if expected.dtype != actual.dtype:
        raise Discrepancy(what, f"dtype {actual.dtype}, expected {expected.dtype}")
    differ, only_encoding = differing(expected, actual, nans, strict)
    if not differ.any():
        return None
    return np.argwhere(differ), [NAN_NOTE] if only_encoding else []


def compare_cache(what: str, expected: np.ndarray, actual: np.ndarray, *, layout: str, block_size: int,
                  owners: Callable[[int], str] | None = None, strict_nan: bool = False) -> None:
    """Raise Discrepancy unless the two caches (`[num_blocks, Bk, H, D]` for "NHD",
    `[num_blocks, H, Bk, D]` for "HND") are bit-equal. The message names the first
    differing element (in the array's own order) as block, offset, slot = block * Bk
    + offset, head and dim, with `owners(slot)` (who wrote or owns it) when given.
    An fp8 (uint8) cache's two NaN codes are equal unless `strict_nan`. Raises
    CacheDiscrepancy."""
    if layout not in ("NHD", "HND"):
        raise ValueError(f"layout must be NHD or HND, got {layout!r}")
    shape = np.shape(expected)
    if len(shape) == 4 and shape[1 if layout == "NHD" else 2] != block_size:
        raise ValueError(f"{what}: block_size {block_size} does not match the {layout} shape {shape}")
    found = _mismatch(what, expected, actual, 4, np.asarray(expected).dtype == np.uint8, strict_nan)
    if found is None:
        return
    differ, notes = found
    first = tuple(int(i) for i in differ[0])
    block, a, b, dim = first
    offset, head = (a, b) if layout == "NHD" else (b, a)
    slot = block * block_size + offset
    owner = f"; {owners(slot)}" if owners is not None else ""
    blocks = sorted({int(i) for i in differ[:, 0]})
    shown = ", ".join(map(str, blocks[:8])) + (" …" if len(blocks) > 8 else "")
    message = (f"{len(differ)} of {np.size(expected)} elements differ (in blocks {shown}); first at block {block}, "
               f"offset {offset} (slot {slot}{owner}), head {head}, dim {dim}: expected "
               f"{element_text(expected[first])}, got {element_text(actual[first])}")
    error = CacheDiscrepancy(what, message, block=block, offset=offset, slot=slot, head=head, dim=dim,
                             expected=expected[first].item(), actual=actual[first].item())
    error.notes += notes
    raise error


def compare_gathered(what: str, expected: np.ndarray, actual: np.ndarray, *,
                     rows: Callable[[int], str] | None = None, nan_rows: int = 0,
                     strict_nan: bool = False) -> None:
    """Raise Discrepancy unless two gather outputs `[rows, H, D]` are bit-equal; the
    message names the first differing element as row, head and dim, with `rows(i)`
    (the request and local index reading it, say) when given. `nan_rows`: in that
    many first rows (the decoded fp8 values a gather writes) any NaN equals any NaN,
    unless `strict_nan`; the rows after them must keep their bits. Raises
    RowsDiscrepancy."""
    shape = np.shape(expected)
    nans = (np.arange(shape[0]) < nan_rows).reshape(-1, *[1] * (len(shape) - 1)) if nan_rows else False
    found = _mismatch(what, expected, actual, 3, nans, strict_nan)
    if found is None:
        return
    differ, notes = found
    first = tuple(int(i) for i in differ[0])
    row, head, dim = first
    owner = f" ({rows(row)})" if rows is not None else ""
    differing_rows = sorted({int(i) for i in differ[:, 0]})
    shown = ", ".join(map(str, differing_rows[:8])) + (" …" if len(differing_rows) > 8 else "")
    message = (f"{len(differ)} of {np.size(expected)} elements differ (in rows {shown}); first at row {row}{owner}, "
               f"head {head}, dim {dim}: expected {element_text(expected[first])}, got {element_text(actual[first])}")
    error = RowsDiscrepancy(what, message, row=row, head=head, dim=dim, expected=expected[first].item(),
                            actual=actual[first].item())
    error.notes += notes
    raise error
