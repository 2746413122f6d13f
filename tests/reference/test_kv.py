"""docs/contract.md §9 in numpy: write, copy and gather on hand-worked cases, whole
arrays compared (bits, so NaN compares), and every rule for bad input.

Why these are easy to get wrong: the two layouts put the block offset on different
axes; caches may be views of one array (a write to one must not touch the other);
key rows past n are padding; slot -1 must write nothing (vLLM #43810 wrote the last
slot); fp8 divides in float32, rounds to even and saturates.
"""

import numpy as np
import pytest

from blocktable.reference import kv
from blocktable.reference.fp8 import decode_e4m3

POISON = -7.0


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(kv.bits(a), kv.bits(b))


def rows(*values) -> np.ndarray:
    """Tokens [T, H=1, D=2] of float32."""
    return np.array(values, dtype=np.float32).reshape(-1, 1, 2)


def test_write_nhd_hand_worked():
    # 3 blocks of Bk=2, H=1, D=2. Slots 3, -1, 0: token 0 -> block 1 offset 1, token 1
    # nowhere, token 2 -> block 0 offset 0. Row 3 of the key is padding (n = 3).
    key = rows([1, 2], [3, 4], [5, 6], [99, 99])
    value = -key
    kc = np.full((3, 2, 1, 2), POISON, np.float32)
    vc = np.full((3, 2, 1, 2), POISON, np.float32)
    kv.write(key, value, kc, vc, np.array([3, -1, 0], np.int64), layout="NHD", kv_cache_dtype="auto")
    expected = np.full((3, 2, 1, 2), POISON, np.float32)
    expected[1, 1, 0] = [1, 2]
    expected[0, 0, 0] = [5, 6]
    assert same_bits(kc, expected)
    expected[1, 1, 0], expected[0, 0, 0] = [-1, -2], [-5, -6]
    assert same_bits(vc, expected)


def test_write_hnd_puts_the_offset_on_axis_2():
    # H=2: token 0 (heads [1,2] and [3,4]) to slot 5 = block 2 offset 1 of Bk=2, so
    # HND entry [2, h, 1, :] for each head h.
    key = np.array([[[1, 2], [3, 4]]], np.float32)
    kc = np.full((3, 2, 2, 2), POISON, np.float32)
    vc = np.full((3, 2, 2, 2), POISON, np.float32)
    kv.write(key, key + 10, kc, vc, np.array([5], np.int64), layout="HND", kv_cache_dtype="auto")
    expected = np.full((3, 2, 2, 2), POISON, np.float32)
    expected[2, 0, 1], expected[2, 1, 1] = [1, 2], [3, 4]
    assert same_bits(kc, expected)
    expected[2, 0, 1], expected[2, 1, 1] = [11, 12], [13, 14]
    assert same_bits(vc, expected)


def test_write_through_views_of_one_array():
    # The caches are buf[:, 0] and buf[:, 1] of one [num_blocks, 2, Bk, H, D] array.
    buf = np.full((2, 2, 2, 1, 2), POISON, np.float32)
    kv.write(rows([1, 2]), rows([3, 4]), buf[:, 0], buf[:, 1], np.array([2], np.int64), layout="NHD",
             kv_cache_dtype="auto")
    expected = np.full_like(buf, POISON)
    expected[1, 0, 0, 0] = [1, 2]  # slot 2 = block 1, offset 0; key half
    expected[1, 1, 0, 0] = [3, 4]  # value half
    assert same_bits(buf, expected)


def test_auto_moves_bits_nan_payloads_included():
    weird = np.array([0x7F800001, 0xFFC12345, 0x80000000, 0x00000001], np.uint32).view(np.float32).reshape(2, 1, 2)
    kc = np.zeros((1, 2, 1, 2), np.float32)
    vc = np.zeros((1, 2, 1, 2), np.float32)
    kv.write(weird, weird, kc, vc, np.array([1, 0], np.int64), layout="NHD", kv_cache_dtype="auto")
    assert same_bits(kc[0, 1], weird[0]) and same_bits(kc[0, 0], weird[1])


def test_bfloat16_is_uint16_bits():
    key = np.array([[[0x3F80, 0xFFFF]]], np.uint16)  # 1.0 and a NaN pattern
    kc = np.zeros((1, 1, 1, 2), np.uint16)
    vc = np.zeros((1, 1, 1, 2), np.uint16)
    kv.write(key, key, kc, vc, np.array([0], np.int64), layout="NHD", kv_cache_dtype="auto")
    assert kc.tolist() == [[[[0x3F80, 0xFFFF]]]]


def test_fp8_write_hand_worked():
    # k_scale 0.5: 1 / 0.5 = 2 -> 0x40; -0.75 / 0.5 = -1.5 -> 0xBC; 600 / 0.5 = 1200
    # saturates -> 0x7E; NaN -> 0x7F. v_scale 4: 1 / 4 = 0.25 -> 0x28; -0.75 / 4 =
    # -0.1875 -> 0xA4 (e=4, m=4: 1.5 * 2**-3); 600 / 4 = 150, between 144 (0x71: e=14,
    # m=1) and 160 (0x72), nearer 144; NaN stays.
    key = np.array([[[1.0, -0.75], [600.0, np.nan]]], np.float32)  # one token, H=2, D=2
    kc = np.zeros((1, 1, 2, 2), np.uint8)
    vc = np.zeros((1, 1, 2, 2), np.uint8)
    kv.write(key, key, kc, vc, np.array([0], np.int64), layout="NHD", kv_cache_dtype="fp8_e4m3", k_scale=0.5,
             v_scale=4.0)
    assert [hex(c) for c in kc.ravel()] == ["0x40", "0xbc", "0x7e", "0x7f"]
    assert [hex(c) for c in vc.ravel()] == ["0x28", "0xa4", "0x71", "0x7f"]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.uint16])
def test_fp8_divides_in_float32(dtype):
    # 3 * 2**-11 / float32(0.1) is 0.0146484372... in exact arithmetic, below the
    # midpoint 15 * 2**-10 between codes 7 and 8; float32 rounds the quotient onto
    # that midpoint, and the tie goes to the even code 8. So a float64 division
    # would give 0x07, the contract 0x08.
    # 9 * 2**-11 / float32(0.3) in float32 is 0.014648436..., just below the same
    # midpoint: 0x07; multiplying by float32(1 / 0.3) instead lands on it: 0x08.
    x = np.array([3 * 2.0**-11, 9 * 2.0**-11], np.float32)
    key = (x.view(np.uint32) >> 16).astype(np.uint16) if dtype == np.uint16 else x.astype(dtype)  # exact in bf16
    key = key.reshape(2, 1, 1)
    caches = [np.zeros((2, 1, 1, 1), np.uint8) for _ in range(2)]
    kv.write(key, key, *caches, np.array([0, 1], np.int64), layout="NHD", kv_cache_dtype="fp8_e4m3", k_scale=0.1,
             v_scale=0.3)
    assert caches[0][0].item() == 0x08
    assert caches[1][1].item() == 0x07


def test_copy_hand_worked():
    kc = np.arange(4 * 2 * 1 * 2, dtype=np.float32).reshape(4, 2, 1, 2)
    vc = -kc
    before = kc.copy()
    kv.copy_blocks([kc], [vc], np.array([[0, 2], [0, 3]], np.int64))
    expected = before.copy()
    expected[2] = expected[3] = before[0]  # all Bk * H * D elements of block 0
    assert same_bits(kc, expected) and same_bits(vc, -expected)


def test_copy_every_layer_and_views_of_one_array():
    layers = [np.arange(3 * 2 * 2 * 1 * 1, dtype=np.float16).reshape(3, 2, 2, 1, 1) + 100 * i for i in range(2)]
    before = [b.copy() for b in layers]
    kv.copy_blocks([b[:, 0] for b in layers], [b[:, 1] for b in layers], np.array([[2, 0]], np.int64))
    for b, old in zip(layers, before):
        expected = old.copy()
        expected[0] = old[2]  # both halves of block 0 (key and value) from block 2
        assert same_bits(b, expected)


def test_gather_hand_worked():
    # Bk=2. Request 0: 3 tokens through row [2, 0]: (block 2, 0), (2, 1), (0, 0).
    # Request 1: empty. Request 2: 1 token through row [1, 1]: (1, 0). Output row 4 is
    # past cu_lens[N] = 4 and keeps its poison.
    kc = np.arange(3 * 2 * 1 * 1, dtype=np.float32).reshape(3, 2, 1, 1)  # entry (b, o) holds 2b + o
    vc = kc + 0.5
    table = np.array([[2, 0], [9, 9], [1, 1]], np.int32)  # row 1 is never read: its request is empty
    cu = np.array([0, 3, 3, 4], np.int32)
    out_k = np.full((5, 1, 1), POISON, np.float32)
    out_v = np.full((5, 1, 1), POISON, np.float32)
    kv.gather(kc, vc, table, cu, out_k, out_v, layout="NHD", kv_cache_dtype="auto")
    assert out_k.ravel().tolist() == [4, 5, 0, 2, POISON]
    assert out_v.ravel().tolist() == [4.5, 5.5, 0.5, 2.5, POISON]


def test_gather_fp8_decodes_then_scales_in_float32():
    # 0x40 = 2.0, * 0.25 = 0.5; 0x01 = 2**-9, * 0.25 = 2**-11; 0xFF is NaN: out is the
    # quiet NaN with the sign, 0xFFC00000; 0x80 = -0.0 stays -0.0.
    kc = np.array([0x40, 0x01, 0xFF, 0x80], np.uint8).reshape(1, 1, 1, 4)  # HND: [blocks, H, Bk, D]
    vc = kc.copy()
    out_k, out_v = np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32)
    kv.gather(kc, vc, np.array([[0]], np.int32), np.array([0, 1], np.int32), out_k, out_v, layout="HND",
              kv_cache_dtype="fp8_e4m3", k_scale=0.25, v_scale=3.0)
    assert [hex(b) for b in out_k.view(np.uint32).ravel()] == ["0x3f000000", "0x3a000000", "0xffc00000", "0x80000000"]
    assert out_v.ravel()[0] == 6.0


def test_write_then_gather_gives_the_tokens_back():
    rng = np.random.default_rng(0)
    num_blocks, Bk, H, D = 6, 4, 2, 3
    for layout in kv.LAYOUTS:
        key = rng.standard_normal((10, H, D)).astype(np.float32)
        value = rng.standard_normal((10, H, D)).astype(np.float32)
        shape = kv.cache_shape(layout, num_blocks, Bk, H, D)
        kc, vc = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        table = np.array([[4, 1, 5], [2, 0, 3]], np.int32)
        # Request 0: tokens 0..6 at positions 0..6; request 1: tokens 7..9 at 0..2.
        positions = [*range(7), *range(3)]
        owners = [0] * 7 + [1] * 3
        slots = np.array([table[r, p // Bk] * Bk + p % Bk for r, p in zip(owners, positions)], np.int64)
        kv.write(key, value, kc, vc, slots, layout=layout, kv_cache_dtype="auto")
        out_k, out_v = np.zeros((10, H, D), np.float32), np.zeros((10, H, D), np.float32)
        kv.gather(kc, vc, table, np.array([0, 7, 10], np.int32), out_k, out_v, layout=layout, kv_cache_dtype="auto")
        assert same_bits(out_k, key) and same_bits(out_v, value)


def test_fp8_round_trip_is_the_decoded_code_times_the_scale():
    x = np.array([[[0.1, 3.0, -1000.0, 1e-5]]], np.float32)
    kc, vc = np.zeros((1, 1, 1, 4), np.uint8), np.zeros((1, 1, 1, 4), np.uint8)
    kv.write(x, x, kc, vc, np.array([0], np.int64), layout="NHD", kv_cache_dtype="fp8_e4m3", k_scale=2.0)
    out_k, out_v = np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32)
    kv.gather(kc, vc, np.array([[0]], np.int32), np.array([0, 1], np.int32), out_k, out_v, layout="NHD",
              kv_cache_dtype="fp8_e4m3", k_scale=2.0)
    assert np.array_equal(out_k[0], decode_e4m3(kc[0, 0]) * np.float32(2.0))
    assert out_k.ravel().tolist()[1:] == [3.0, -896.0, 0.0]  # -1000 / 2 saturates to -448, times 2; 1e-5 / 2 is 0


# ---- bad input: the right error, and nothing changed ---------------------------------

def rejects(arrays, error, match, fn, *args, **kw):
    before = [a.copy() for a in arrays]
    with pytest.raises(error, match=match):
        fn(*args, **kw)
    for a, b in zip(arrays, before):
        assert same_bits(a, b), "an array changed although the call was rejected"


def write_inputs(n=3, num_blocks=2, Bk=2, dtype=np.float32):
    key = np.ones((n, 1, 2), dtype)
    cache = np.zeros((num_blocks, Bk, 1, 2), dtype)
    return key, key.copy(), cache, cache.copy()


WRITE_ERRORS = [
    ("slot 4 of token 1 lies outside the cache \\(2 blocks of 2\\)", ValueError, dict(slots=[0, 4, -1])),
    ("slot 1 is written by tokens 0 and 2 in one call", ValueError, dict(slots=[1, -1, 1])),
    ("layout must be one of NHD, HND, got 'NDH'", ValueError, dict(layout="NDH")),
    ("kv_cache_dtype must be one of auto, fp8_e4m3, got 'fp8'", ValueError, dict(kv_cache_dtype="fp8")),
    ("k_scale must be finite and > 0 in float32, got 0.0", ValueError, dict(k_scale=0.0)),
    ("v_scale must be finite and > 0 in float32, got 1e-50", ValueError, dict(v_scale=1e-50)),  # 0 in float32
    ("k_scale must be finite and > 0 in float32, got nan", ValueError, dict(k_scale=float("nan"))),
    ("k_scale must be a Python float, got ndarray", TypeError, dict(k_scale=np.ones(1, np.float32))),
    ("slot_mapping must be int64, got int32", TypeError, dict(slot_dtype=np.int32)),
    ('"auto": the caches must be float32 like key, got float16', TypeError, dict(cache_dtype=np.float16)),
    ('"fp8_e4m3": the caches must be uint8, got float32', TypeError, dict(kv_cache_dtype="fp8_e4m3")),
    ("key must be float16, bfloat16 or float32, got float64", TypeError, dict(dtype=np.float64)),
    ("key has 2 rows for 3 slots", ValueError, dict(key_rows=2)),
]


@pytest.mark.parametrize("match, error, change", WRITE_ERRORS, ids=[e[0][:40] for e in WRITE_ERRORS])
def test_bad_writes_are_rejected_and_change_nothing(match, error, change):
    dtype = change.get("dtype", np.float32)
    key, value, kc, vc = write_inputs(dtype=dtype)
    if "cache_dtype" in change:
        kc, vc = kc.astype(change["cache_dtype"]), vc.astype(change["cache_dtype"])
    key = key[:change.get("key_rows", 3)]
    slots = np.array(change.get("slots", [0, 1, 2]), change.get("slot_dtype", np.int64))
    kw = dict(layout=change.get("layout", "NHD"), kv_cache_dtype=change.get("kv_cache_dtype", "auto"),
              k_scale=change.get("k_scale", 1.0), v_scale=change.get("v_scale", 1.0))
    rejects([kc, vc], error, match, kv.write, key, value, kc, vc, slots, **kw)


def test_write_shape_mismatches_are_rejected():
    key, value, kc, vc = write_inputs()
    slots = np.array([0, 1, 2], np.int64)
    auto = dict(layout="NHD", kv_cache_dtype="auto")
    rejects([kc, vc], ValueError, "key is \\[tokens, H, D\\] = \\[3, 1, 3\\] but the caches hold H=1, D=2",
            kv.write, np.ones((3, 1, 3), np.float32), value, kc, vc, slots, **auto)
    rejects([kc, vc], ValueError, "value_cache has shape", kv.write, key, value, kc, vc[:1], slots, **auto)
    rejects([kc], TypeError, "value is float16 but key is float32", kv.write, key, value.astype(np.float16),
            kc, vc, slots, **auto)
    rejects([kc, vc], ValueError, "key must be 3-D", kv.write, key[0], value, kc, vc, slots, **auto)


def test_bad_copies_are_rejected_and_change_nothing():
    kc = np.arange(8, dtype=np.float32).reshape(4, 2, 1, 1)
    vc = -kc
    for pairs, match in [([[0, 1], [2, 1]], "block 1 is a destination twice"),
                         ([[0, 1], [1, 2]], "block 1 is both a source and a destination"),
                         ([[0, 4]], "block 4 of pair \\(0, 4\\) lies outside the caches' 4 blocks"),
                         ([[-1, 2]], "block -1 of pair \\(-1, 2\\) lies outside")]:
        rejects([kc, vc], ValueError, match, kv.copy_blocks, [kc], [vc], np.array(pairs, np.int64))
    rejects([kc, vc], ValueError, "1 key caches but 0 value caches", kv.copy_blocks, [kc], [],
            np.zeros((0, 2), np.int64))
    rejects([kc, vc], ValueError, "block_mapping must be \\[m, 2\\]", kv.copy_blocks, [kc], [vc],
            np.zeros((1, 3), np.int64))
    rejects([kc], TypeError, "the caches mix float32 and float16", kv.copy_blocks, [kc], [vc.astype(np.float16)],
            np.zeros((0, 2), np.int64))


def test_bad_gathers_are_rejected_and_change_nothing():
    kc = np.zeros((3, 2, 1, 1), np.float32)  # 3 blocks of Bk=2
    table = np.array([[0, 1], [2, 2]], np.int32)
    out = np.full((8, 1, 1), POISON, np.float32)
    auto = dict(layout="NHD", kv_cache_dtype="auto")
    for cu, match in [([1, 2, 3], "cu_lens\\[0\\] must be 0, got 1"),
                      ([0, 3, 2], "cu_lens decreases at request 1: 3 -> 2"),
                      ([0, 2, 9], "cu_lens\\[N\\] = 9 tokens but the outputs have 8 rows"),
                      ([0, 5], "request 0 has 5 tokens but its row holds 2 blocks of 2"),
                      ([0, 0, 0, 0], "3 requests but the block table has only 2 rows")]:
        rejects([out], ValueError, match, kv.gather, kc, kc, table, np.array(cu, np.int32), out, out.copy(), **auto)
    bad_table = np.array([[0, 3], [2, 2]], np.int32)  # column 1 of request 0 is read only past 2 tokens
    kv.gather(kc, kc, bad_table, np.array([0, 2, 2], np.int32), out, out.copy(), **auto)
    rejects([out], ValueError, "block_table\\[0, 1\\] = 3 lies outside the cache's 3 blocks", kv.gather, kc, kc,
            bad_table, np.array([0, 3, 3], np.int32), out, out.copy(), **auto)
    rejects([out], TypeError, "out_key must be float32, got float16", kv.gather, kc, kc, table,
            np.array([0, 1], np.int32), out.astype(np.float16), out, **auto)
    rejects([out], TypeError, "cu_lens must be int32, got int64", kv.gather, kc, kc, table,
            np.array([0, 1], np.int64), out, out.copy(), **auto)
    fp8 = dict(layout="NHD", kv_cache_dtype="fp8_e4m3")
    codes = np.zeros((3, 2, 1, 1), np.uint8)
    rejects([out], TypeError, "out_value must be float32, got float16", kv.gather, codes, codes, table,
            np.array([0, 1], np.int32), out, out.astype(np.float16), **fp8)
