"""The KV cache's number formats that numpy lacks, as bit patterns (docs/contract.md §9).

- **float8 e4m3fn** (`uint8` bits): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa
  bits; no infinities; `S.1111.111` (0x7F, 0xFF) is NaN, so the largest finite value is
  `1.75 * 2**8 = 448` (0x7E). Exponent field 0 holds the subnormals `m * 2**-9`.
  The contract's encoder rounds a float32 to the nearest code, ties to the even code,
  saturates whatever lies beyond ±448 (infinities included) to ±448, makes every NaN
  0x7F, and keeps the sign of everything else (values that round to zero too).
  Why 0x7F whatever the NaN's sign: the write encodes `x / scale`, and a GPU's
  division returns its canonical positive NaN (x86's keeps the operand's sign), so
  a sign rule would make the stored code depend on the device; vLLM's CUDA kernel
  stores 0x7F. Decoding keeps both NaN codes' signs (another writer may store 0xFF).
- **bfloat16** (`uint16` bits): the top half of a float32. The reference holds bf16
  buffers as `uint16` arrays of these bits; a `uint16` array in this package always
  means bfloat16 (float16 is numpy's own `float16`).

The encoder here is written to be read, not to be fast: it compares each value with
the midpoints between neighbouring codes, which are exact in float64.

torch's own float32 -> float8_e4m3fn cast differs from this encoder in two places:
- a negative NaN: torch keeps the sign (0xFF), this encoder gives 0x7F;
- overflow, before pytorch/pytorch#178817 (April 2026; torch 2.13 has it, 2.11 does
  not): torch made NaN (0x7F/0xFF) of every value whose magnitude rounds past 448
  (|x| > 464, ±inf included); since then it saturates to ±448, as here.
It agrees everywhere else; tests/reference/test_fp8.py checks all three facts against
the installed torch.
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0
E4M3_NAN = 0x7F  # with the sign bit: 0xFF
FLOAT32_NAN_BITS = 0x7FC00000  # the quiet NaN a NaN code decodes to (with its sign bit)


def _e4m3_magnitudes() -> np.ndarray:
    """float64 values of the non-negative finite codes 0x00 .. 0x7E, in code order
    (which is also increasing order)."""
    codes = np.arange(0x7F)
    exponent, mantissa = codes >> 3, codes & 7
    subnormal = mantissa * 2.0**-9
    normal = (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    return np.where(exponent == 0, subnormal, normal)


MAGNITUDES = _e4m3_magnitudes()
# MIDPOINTS[i] lies halfway between codes i and i+1; every one is exact in float64.
MIDPOINTS = (MAGNITUDES[:-1] + MAGNITUDES[1:]) / 2


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """float32 values of e4m3fn codes (any shape of uint8). Exact: every code is a
    float32. A NaN code gives the quiet NaN 0x7FC00000 with the code's sign."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"e4m3 codes must be uint8, got {codes.dtype}")
    sign = (codes >> 7).astype(np.uint32)
    magnitude = MAGNITUDES[np.minimum(codes & 0x7F, 0x7E)].astype(np.float32)
    value = np.where(sign == 1, -magnitude, magnitude).astype(np.float32)
    nan_bits = (np.uint32(FLOAT32_NAN_BITS) | (sign << np.uint32(31))).view(np.float32)
    return np.where((codes & 0x7F) == E4M3_NAN, nan_bits, value)


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """e4m3fn codes (uint8) of float32 values: round to nearest, ties to even,
    saturate to ±448, every NaN 0x7F, the sign of everything else kept (zeros too)."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"encode_e4m3 takes float32 (convert first), got {x.dtype}")
    negative = np.signbit(x)
    with np.errstate(invalid="ignore"):  # a signalling NaN warns as it widens
        magnitude = np.abs(x.astype(np.float64))  # exact; NaN stays NaN (handled last)
    finite_magnitude = np.where(np.isnan(magnitude), 0.0, magnitude)
    # Below code i+1's midpoint with code i: `lower` is the largest code whose value
    # does not exceed the magnitude (448 and above: 0x7E, the saturation).
    lower = np.searchsorted(MAGNITUDES, finite_magnitude, side="right") - 1
    lower = np.minimum(lower, 0x7E)
    upper = np.minimum(lower + 1, 0x7E)
    midpoint = MIDPOINTS[np.minimum(lower, len(MIDPOINTS) - 1)]
    above = finite_magnitude > midpoint
    tie = finite_magnitude == midpoint
    lower_is_even = lower % 2 == 0  # a code's last bit is its mantissa's last bit
    code = np.where(above | (tie & ~lower_is_even), upper, lower)
    code = np.where(lower == 0x7E, 0x7E, code)  # beyond 448 (or at it): saturate
    code = code | np.where(negative, 0x80, 0)
    return np.where(np.isnan(magnitude), E4M3_NAN, code).astype(np.uint8)


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (uint16): exact, NaN payloads kept."""
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"bfloat16 bits must be uint16, got {bits.dtype}")
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


BFLOAT16_NAN = 0x7FC0  # what a NaN becomes, whatever its sign or payload (as torch does)


def float32_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of float32 values: round to nearest, ties to
    even (overflow rounds to ±inf, as IEEE does); every NaN becomes 0x7FC0."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"float32_to_bfloat16 takes float32, got {x.dtype}")
    bits = x.view(np.uint32).astype(np.uint64)  # room for the carry of rounding 0xFFFF....
    lowest_kept = (bits >> np.uint64(16)) & np.uint64(1)
    rounded = (bits + np.uint64(0x7FFF) + lowest_kept) >> np.uint64(16)
    return np.where(np.isnan(x), BFLOAT16_NAN, rounded).astype(np.uint16)
