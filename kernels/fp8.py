"""The fp8 e4m3fn codec of docs/contract.md §9 as Triton functions, for the KV kernels
(blocktable.kernels.kv): round to nearest even, ±448 beyond the range (infinities
too), every NaN 0x7F. Two encoders give those codes: on GPUs with fp8 conversion
(compute capability 8.9 and up) the hardware's `cvt.rn.satfinite.e4m3x2.f32`, four
values to an instruction pair, behind a clamp that decides saturation and NaN first
(so no rule rests on what the conversion does at the edges); elsewhere, and in the
interpreter, integer operations on float32 bits. Decoding is always integer
arithmetic. With fp8 the KV write is bound by instructions rather than bytes on an
H200, so the division is done in three operations (see `quantize`) and the encoder
is kept short.
"""

import triton
import triton.language as tl

FLOAT32_2_POW_MINUS_6 = tl.constexpr(0x3C800000)  # the smallest normal e4m3 value, as float32 bits
FLOAT32_INF = tl.constexpr(0x7F800000)
FLOAT32_NAN = tl.constexpr(0x7FC00000)  # what a NaN code decodes to (with its sign)
FLOAT32_2_POW_14 = tl.constexpr(0x46800000)


@triton.jit
def e4m3_magnitude(q):
    """e4m3 codes 0..0x7E of float32 magnitudes `q` (>= 0, any NaN taken as 448):
    round to nearest even, 448 and beyond (infinity too) to 0x7E."""
    # minimum(NaN, 448) is 448 on a GPU and in the interpreter alike (IEEE minNum).
    a = tl.minimum(q, 448.0).to(tl.int32, bitcast=True)
    # Normal results: rebias the exponent (127 -> 7) and keep 3 of the 23 mantissa
    # bits, adding just under half of the dropped part plus the kept part's last bit
    # (ties to even); a carry runs into the exponent, as it should.
    normal = (a + (0x7FFFF - (120 << 23)) + ((a >> 20) & 1)) >> 20
    # Subnormal results m * 2**-9 (below 2**-6): in 2**14 + q the float32 ulp is 2**-9,
    # so the hardware's round-to-nearest-even addition leaves m in the low bits (m = 8,
    # the code of 2**-6, when it rounds up across the boundary).
    subnormal = (a.to(tl.float32, bitcast=True) + 16384.0).to(tl.int32, bitcast=True) - FLOAT32_2_POW_14
    return tl.where(a < FLOAT32_2_POW_MINUS_6, subnormal, normal)


@triton.jit
def e4m3_encode(x):
    """int32 e4m3fn codes (0..255) of float32 `x`: the sign kept, every NaN 0x7F."""
    bits = x.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    code = e4m3_magnitude(a.to(tl.float32, bitcast=True)) | ((bits >> 24) & 0x80)
    return tl.where(a > FLOAT32_INF, 0x7F, code)


@triton.jit
def e4m3_convert(q):
    """uint8 e4m3fn codes of float32 `q` by the GPU's conversion: round to nearest
    even, saturating at ±448. `cvt...e4m3x2` packs two codes into 16 bits, its first
    operand in the high byte; four codes make one 32-bit result."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b16 lo, hi;
        cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;
        cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;
        mov.b32 $0, {lo, hi};
        }""",
        constraints="=r,r,r,r,r", args=[q.to(tl.int32, bitcast=True)], dtype=tl.uint8, is_pure=True, pack=4)


@triton.jit
def divide(x, scale, reciprocal, EXACT_DIVISION: tl.constexpr):
    """float32 x / scale, correctly rounded, the sign of zero kept. Unless
    EXACT_DIVISION (IEEE division: a dozen instructions and a slow-path branch),
    Markstein's division in three: q0 = x * r with r = RN(1 / scale) from the host,
    the residual q0 * scale - x (exact in an fma), and q0 corrected by -residual * r in
    one more fma, which gives the rounded quotient when nothing under- or overflows.
    (The residual is negated rather than taken as x - q0 * scale so that x = -0 gives
    -0: -0 + +0 is +0. And negated by multiplying by -1: Triton's unary minus is 0 - x,
    which makes +0 of -0 too.) The host takes this path only for scales in [2**-64, 2**64],
    so every quotient that can round to a nonzero code (2**-11 and up) comes from
    normal numbers, and smaller ones encode to a zero even if off by an ulp."""
    if EXACT_DIVISION:
        q = tl.math.div_rn(x, scale)
    else:
        q0 = x * reciprocal
        q = tl.fma(tl.fma(q0, scale, x * -1.0) * -1.0, reciprocal, q0)
    return q


@triton.jit
def quantize(x, scale, reciprocal, EXACT_DIVISION: tl.constexpr, HARDWARE_FP8: tl.constexpr):
    """uint8 e4m3fn codes of float32 x / scale, the quotient correctly rounded (see
    `divide`); every NaN gives 0x7F, whatever its sign.

    HARDWARE_FP8: the GPU converts. Saturation is decided before it: the fast division
    takes x clamped to ±448 * scale (a quotient near the float32 maximum, or infinite,
    would make its residual NaN), the IEEE one clamps its quotient to ±448, both
    keeping NaN as NaN; a NaN reaching the conversion is the GPU's canonical NaN
    (positive: arithmetic on a NaN does not keep its sign), which gives 0x7F.

    Otherwise the integer encoder, on |x| (the sign is x's, scale > 0, put back on
    the code), where a quotient too large for the residual comes out infinite or NaN
    and both saturate to 448."""
    if HARDWARE_FP8:
        if EXACT_DIVISION:
            q = tl.clamp(divide(x, scale, reciprocal, EXACT_DIVISION), -448.0, 448.0,
                         propagate_nan=tl.PropagateNan.ALL)
        else:
            limit = 448.0 * scale
            q = divide(tl.clamp(x, -limit, limit, propagate_nan=tl.PropagateNan.ALL), scale, reciprocal,
                       EXACT_DIVISION)
        codes = e4m3_convert(q)
    else:
        bits = x.to(tl.int32, bitcast=True)
        magnitude = (bits & 0x7FFFFFFF).to(tl.float32, bitcast=True)
        code = e4m3_magnitude(divide(magnitude, scale, reciprocal, EXACT_DIVISION)) | ((bits >> 24) & 0x80)
        codes = tl.where((bits & 0x7FFFFFFF) > FLOAT32_INF, 0x7F, code).to(tl.uint8)
    return codes


@triton.jit
def e4m3_decode(code, scale):
    """float32 decode(code) * scale for int32 codes; a NaN code gives the quiet NaN
    with its sign, never a product (whose NaN bits differ between devices)."""
    sign = (code & 0x80) << 24
    # The code's 7 bits moved to the top of a float32's exponent and mantissa make a
    # float 2**-120 times the code's value (subnormal codes land on float32
    # subnormals, which Triton's multiply keeps); scaling by 2**120 is exact.
    magnitude = ((code & 0x7F) << 20).to(tl.float32, bitcast=True) * 1.329227995784916e36  # 2**120
    value = (magnitude.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True) * scale
    nan = (sign | FLOAT32_NAN).to(tl.float32, bitcast=True)
    return tl.where((code & 0x7F) == 0x7F, nan, value)
