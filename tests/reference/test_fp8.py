"""The number formats of docs/contract.md §9 in numpy: float8 e4m3fn (decode every code,
encode at every rounding boundary) and bfloat16 as uint16 bits, against hand-worked
values and against torch's own conversions.

e4m3fn: code = s eeee mmm; exponent field 0 is subnormal (m * 2**-9), else
(1 + m/8) * 2**(e - 7); 0x7F / 0xFF are NaN, so 0x7E = 1.75 * 2**8 = 448 is the
largest value. The encoder must round to nearest with ties to the even code (a
code's last bit is its mantissa's), saturate to ±448, make every NaN 0x7F and keep
every other sign.
"""

import numpy as np
import pytest
import torch

from blocktable.reference.fp8 import (
    BFLOAT16_NAN,
    MAGNITUDES,
    bfloat16_to_float32,
    decode_e4m3,
    encode_e4m3,
    float32_to_bfloat16,
)

ALL_CODES = np.arange(256, dtype=np.uint8)
NAN_CODES = {0x7F, 0xFF}


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def from_bits(*patterns: int) -> np.ndarray:
    return np.array(patterns, dtype=np.uint32).view(np.float32)


def torch_encode(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(x.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def test_decode_hand_worked_codes():
    cases = {
        0x00: 0.0,
        0x01: 2.0**-9,  # the smallest subnormal
        0x07: 7 * 2.0**-9,  # the largest subnormal
        0x08: 2.0**-6,  # the smallest normal: e=1, m=0
        0x38: 1.0,  # e=7 (bias 7), m=0
        0x3C: 1.5,  # m=4: 1 + 4/8
        0x40: 2.0,
        0x78: 256.0,  # e=15, m=0
        0x7E: 448.0,  # e=15, m=6: 1.75 * 2**8
        0xB8: -1.0,
        0xFE: -448.0,
    }
    got = decode_e4m3(np.array(list(cases), dtype=np.uint8))
    assert got.dtype == np.float32
    assert list(got) == list(cases.values())
    signed_zero = decode_e4m3(np.array([0x80], np.uint8))
    assert signed_zero.view(np.uint32)[0] == 0x80000000  # -0.0, not +0.0
    nans = decode_e4m3(np.array([0x7F, 0xFF], np.uint8)).view(np.uint32)
    assert [hex(b) for b in nans] == ["0x7fc00000", "0xffc00000"]  # quiet NaN, the code's sign


def test_decode_all_256_codes_against_torch():
    ours = decode_e4m3(ALL_CODES)
    theirs = torch.from_numpy(ALL_CODES).view(torch.float8_e4m3fn).to(torch.float32).numpy()
    assert set(np.flatnonzero(np.isnan(ours))) == NAN_CODES
    assert set(np.flatnonzero(np.isnan(theirs))) == NAN_CODES
    finite = ~np.isnan(ours)
    assert np.array_equal(ours.view(np.uint32)[finite], theirs.view(np.uint32)[finite])  # ±0 included
    assert np.array_equal(np.signbit(ours), np.signbit(theirs))  # NaN signs too


def test_positive_codes_increase_and_negative_codes_mirror_them():
    values = decode_e4m3(ALL_CODES)
    assert (np.diff(values[:0x7F]) > 0).all()
    assert np.array_equal(values[0x80:0xFF], -values[:0x7F])


def test_every_code_round_trips():
    # 0xFF (a negative NaN) comes back as 0x7F, the encoder's one NaN.
    assert np.array_equal(encode_e4m3(decode_e4m3(ALL_CODES)), np.where(ALL_CODES == 0xFF, 0x7F, ALL_CODES))


def test_hand_worked_rounding():
    cases = [
        (1.0625, 0x38),  # halfway 1.0 (0x38) / 1.125 (0x39): to even, down
        (1.1875, 0x3A),  # halfway 1.125 (0x39) / 1.25 (0x3A): to even, up
        (2.0**-10, 0x00),  # halfway 0 / 2**-9: to even, 0
        (3 * 2.0**-10, 0x02),  # halfway codes 1 / 2: up to 2
        (15 * 2.0**-10, 0x08),  # halfway 7 * 2**-9 / 2**-6: up across the subnormal boundary
        (0.3, 0x2A),  # nearest: 0.3125 (0x2A) is 0.0125 away, 0.28125 (0x29) 0.01875
        (-0.3, 0xAA),
    ]
    got = encode_e4m3(f32(*(x for x, _ in cases)))
    assert [hex(c) for c in got] == [hex(c) for _, c in cases]


def _neighbours_around_midpoints(sign: float):
    """(value, expected code) at, just above and just below every midpoint between two
    neighbouring codes of one sign: the exact midpoint goes to the even code."""
    below, above = np.arange(0x7E), np.arange(1, 0x7F)
    mid64 = (MAGNITUDES[below] + MAGNITUDES[above]) / 2
    mid = mid64.astype(np.float32)
    assert np.array_equal(mid.astype(np.float64), mid64)  # every midpoint is a float32
    even = np.where(below % 2 == 0, below, above)
    bit = 0x80 if sign < 0 else 0
    values = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(0))])
    codes = np.concatenate([even, above, below]) | bit
    return sign * values, codes.astype(np.uint8)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_midpoints_round_to_even_and_their_neighbours_to_the_nearest(sign):
    values, codes = _neighbours_around_midpoints(sign)
    assert np.array_equal(encode_e4m3(values.astype(np.float32)), codes)


def test_saturation_to_448():
    big = f32(448.0, np.nextafter(np.float32(448), np.float32(np.inf)), 464.0, 465.0, 480.0, 1e6,
              np.finfo(np.float32).max, np.inf)
    # 464 is halfway between 448 and the 480 a 0x7F would be: a tie that goes to even
    # 448 anyway; everything past it would round to 480 and saturates.
    assert list(encode_e4m3(big)) == [0x7E] * len(big)
    assert list(encode_e4m3(-big)) == [0xFE] * len(big)
    assert list(encode_e4m3(f32(416.0, 431.9, 432.0, 432.1))) == [0x7D, 0x7D, 0x7E, 0x7E]  # 432: tie, even 0x7E


def test_zeros_and_tiny_values_keep_their_sign_and_every_nan_is_0x7f():
    tiny = from_bits(0x00000001, 0x80000001, 0x007FFFFF, 0x00800000)  # float32 subnormals, FLT_MIN
    assert list(encode_e4m3(tiny)) == [0x00, 0x80, 0x00, 0x00]
    assert list(encode_e4m3(f32(0.0, -0.0, -2.0**-11, 2.0**-10, -2.0**-10))) == [0x00, 0x80, 0x80, 0x00, 0x80]
    nans = from_bits(0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FBFFFFF)  # quiet, signalling, payloads
    assert list(encode_e4m3(nans)) == [0x7F] * 5


def _broad_float32_sample() -> np.ndarray:
    """Every float16 and every bfloat16 value (as float32), the boundary cases above,
    and a million random float32 bit patterns."""
    rng = np.random.default_rng(0)
    every16 = np.arange(2**16, dtype=np.uint16)
    boundaries = [_neighbours_around_midpoints(s)[0].astype(np.float32) for s in (1.0, -1.0)]
    return np.concatenate([every16.view(np.float16).astype(np.float32), bfloat16_to_float32(every16),
                           *boundaries, rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64)
                           .astype(np.uint32).view(np.float32)])


def test_encode_agrees_with_torch_wherever_torch_is_defined_to():
    """torch's float32 -> float8_e4m3fn cast rounds to nearest even, as the contract
    does. It may differ in two places only: a negative NaN (torch keeps the sign,
    0xFF; the contract stores 0x7F), and overflow: torch made NaN of every value whose
    magnitude rounds past 448 (|x| > 464, the midpoint to the 480 that 0x7F would be;
    ±inf included) until pytorch/pytorch#178817 made it saturate. So: equal everywhere
    else, and at overflow either equal (a saturating torch) or NaN."""
    x = _broad_float32_sample()
    ours, theirs = encode_e4m3(x), torch_encode(x)
    differ = ours != theirs
    negative_nan = np.isnan(x) & np.signbit(x)
    overflow = ~np.isnan(x) & (np.abs(x) > np.float32(464))
    unexplained = differ & ~negative_nan & ~overflow
    assert not unexplained.any(), f"first disagreement at {x[unexplained][:5]}"
    assert set(theirs[differ & overflow].tolist()) <= NAN_CODES
    assert (theirs[negative_nan] == 0xFF).all() and (ours[negative_nan] == 0x7F).all()
    assert overflow.sum() > 100_000 and negative_nan.sum() > 100  # the sample reaches both


def test_which_overflow_rule_this_torch_follows():
    """Recorded, not assumed: the installed torch either saturates like the contract
    (torch with pytorch/pytorch#178817: 2.13 does) or makes NaN (2.11 does)."""
    x = f32(464.0, 464.25, 480.0, 1e6, np.inf, -464.25, -np.inf)
    ours = encode_e4m3(x)
    assert list(ours) == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE]
    theirs = list(torch_encode(x))
    assert theirs[0] == 0x7E  # 464 is a tie, and goes to the even 448 in both rules
    assert theirs[1:] in ([0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE], [0x7F, 0x7F, 0x7F, 0x7F, 0xFF, 0xFF]), theirs


def test_codec_rejects_other_dtypes():
    with pytest.raises(TypeError, match="e4m3 codes must be uint8, got int8"):
        decode_e4m3(np.zeros(2, np.int8))
    with pytest.raises(TypeError, match="encode_e4m3 takes float32 \\(convert first\\), got float64"):
        encode_e4m3(np.zeros(2))


def test_bfloat16_hand_worked():
    assert bfloat16_to_float32(np.array([0x3F80, 0xC000, 0x0001, 0x7F80], np.uint16)).tolist() == \
        [1.0, -2.0, 2.0**-133, np.inf]
    x = f32(1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-20, np.finfo(np.float32).max, -0.0)
    # 1 + 2**-8 is halfway between bf16 1.0 (0x3F80) and 1.0078125 (0x3F81): to even, down;
    # 1 + 3 * 2**-8 is halfway 0x3F81 / 0x3F82: up; just above a tie: up; FLT_MAX rounds to inf.
    assert [hex(b) for b in float32_to_bfloat16(x)] == ["0x3f80", "0x3f80", "0x3f82", "0x3f81", "0x7f80", "0x8000"]
    assert list(float32_to_bfloat16(from_bits(0x7F800001, 0xFFC00000))) == [BFLOAT16_NAN, BFLOAT16_NAN]


def test_bfloat16_agrees_with_torch():
    every = np.arange(2**16, dtype=np.uint16)
    theirs = torch.from_numpy(every.view(np.int16)).view(torch.bfloat16).to(torch.float32).numpy()
    assert np.array_equal(bfloat16_to_float32(every).view(np.uint32), theirs.view(np.uint32))  # NaN payloads too
    x = _broad_float32_sample()
    rounded = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    finite = ~np.isnan(x)  # torch's NaN pattern depends on the code path (0x7FC0 or 0xFFFF); ours is fixed
    assert np.array_equal(float32_to_bfloat16(x)[finite], rounded[finite])
    assert np.isnan(bfloat16_to_float32(rounded[~finite])).all()
