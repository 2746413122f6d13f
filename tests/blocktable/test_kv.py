"""The input checks of the KV path (docs/contract.md §9): every bad call is refused
before anything runs, with the same error and message from the reference, our
Triton wrappers and the torch-native versions, and changes nothing. The data checks
(slots, pairs, lengths and block ids) follow blocktable.checks' `data_checks` switch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from blocktable import kv, kv_torch
from blocktable.checks import data_checks
from blocktable.reference import kv as reference

SIDES = ["reference", "triton", "torch"]
FUNCTIONS = {
    "write": {"reference": reference.write, "triton": kv.write, "torch": kv_torch.write_torch},
    "copy": {"reference": reference.copy_blocks, "triton": kv.copy_blocks, "torch": kv_torch.copy_blocks_torch},
    "gather": {"reference": reference.gather, "triton": kv.gather, "torch": kv_torch.gather_torch},
}


def to_side(value, side: str, device):
    """numpy arrays as they are for the reference, as tensors for the other sides."""
    if side == "reference":
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy()).to(device)
    if isinstance(value, list):
        return [to_side(v, side, device) for v in value]
    return value


def arrays(values) -> list:
    found = []
    for v in values:
        if isinstance(v, list):
            found.extend(arrays(v))
        elif isinstance(v, (np.ndarray, torch.Tensor)):
            found.append(v)
    return found


def snapshot(a) -> np.ndarray:
    return (a.cpu().numpy() if isinstance(a, torch.Tensor) else a).copy().view(np.uint8)


def refused_everywhere(op: str, error: type, match: str, args: list, kw: dict, device) -> None:
    for side in SIDES:
        side_args = [to_side(a, side, device) for a in args]
        before = [snapshot(a) for a in arrays(side_args)]
        with pytest.raises(error, match=match):
            FUNCTIONS[op][side](*side_args, **kw)
        after = [snapshot(a) for a in arrays(side_args)]
        assert all(np.array_equal(b, a) for b, a in zip(before, after)), f"{side} changed an input"


# ---- write ---------------------------------------------------------------------------

def write_call(n=3, num_blocks=2, Bk=2, key_dtype=np.float32, cache_dtype=None, slots=None, key_rows=None,
               slot_dtype=np.int64, **kw):
    key = np.arange((key_rows or n) * 2, dtype=np.float32).reshape(-1, 1, 2).astype(key_dtype)
    cache = np.zeros((num_blocks, Bk, 1, 2), cache_dtype or key_dtype)
    slots = np.array([0, 1, 2] if slots is None else slots, slot_dtype)
    args = [key, key.copy(), cache, cache.copy(), slots]
    return args, {"layout": "NHD", "kv_cache_dtype": "auto", "k_scale": 1.0, "v_scale": 1.0, **kw}


WRITE_ERRORS = [
    (ValueError, "slot 4 of token 1 lies outside the cache \\(2 blocks of 2\\)", dict(slots=[0, 4, -1])),
    (ValueError, "slot 1 is written by tokens 0 and 2 in one call", dict(slots=[1, -1, 1])),
    (ValueError, "slot 0 is written by tokens 1 and 2 in one call", dict(slots=[3, 0, 0])),
    (ValueError, "slot 3 is written by tokens 1 and 2 in one call", dict(n=4, slots=[2, 3, 3, 2])),  # the first repeat
    (ValueError, "layout must be one of NHD, HND, got 'NDH'", dict(layout="NDH")),
    (ValueError, "kv_cache_dtype must be one of auto, fp8_e4m3, got 'fp8'", dict(kv_cache_dtype="fp8")),
    (ValueError, "k_scale must be finite and > 0 in float32, got 0.0", dict(k_scale=0.0)),
    (ValueError, "v_scale must be finite and > 0 in float32, got 1e-50", dict(v_scale=1e-50)),
    (ValueError, "k_scale must be finite and > 0 in float32, got 1e\\+39", dict(k_scale=1e39)),
    (ValueError, "v_scale must be finite and > 0 in float32, got -1", dict(v_scale=-1)),
    (TypeError, "k_scale must be a Python float, got str", dict(k_scale="1.0")),
    (TypeError, "v_scale must be a Python float, got bool", dict(v_scale=True)),
    (TypeError, "slot_mapping must be int64, got int32", dict(slot_dtype=np.int32)),
    (TypeError, '"auto": the caches must be float32 like key, got float16', dict(cache_dtype=np.float16)),
    (TypeError, '"fp8_e4m3": the caches must be uint8, got float32', dict(kv_cache_dtype="fp8_e4m3")),
    (TypeError, "key must be float16, bfloat16 or float32, got float64", dict(key_dtype=np.float64)),
    (TypeError, "key must be float16, bfloat16 or float32, got uint8",
     dict(key_dtype=np.uint8, kv_cache_dtype="fp8_e4m3")),
    (ValueError, "key has 2 rows for 3 slots", dict(key_rows=2)),
]


@pytest.mark.parametrize("error, match, change", WRITE_ERRORS, ids=[e[1][:48] for e in WRITE_ERRORS])
def test_bad_writes(backend, error, match, change):
    args, kw = write_call(**change)
    refused_everywhere("write", error, match, args, kw, backend.device)


def test_bad_write_shapes(backend):
    args, kw = write_call()
    key, value, kc, vc, slots = args
    d = backend.device
    refused_everywhere("write", ValueError, "key is \\[tokens, H, D\\] = \\[3, 1, 3\\] but the caches hold H=1, D=2",
                       [np.ones((3, 1, 3), np.float32), value, kc, vc, slots], kw, d)
    refused_everywhere("write", ValueError, "value_cache has shape \\(1, 2, 1, 2\\) but key_cache \\(2, 2, 1, 2\\)",
                       [key, value, kc, vc[:1], slots], kw, d)
    refused_everywhere("write", TypeError, "value is float16 but key is float32",
                       [key, value.astype(np.float16), kc, vc, slots], kw, d)
    refused_everywhere("write", ValueError, "key must be 3-D, got shape \\(1, 2\\)", [key[0], value, kc, vc, slots],
                       kw, d)
    refused_everywhere("write", ValueError, "slot_mapping must be 1-D", [key, value, kc, vc, slots[None]], kw, d)


def test_a_tensor_on_another_device_is_refused(backend):
    args, kw = write_call()
    tensors = [torch.from_numpy(a).to(backend.device) for a in args]
    tensors[2] = torch.empty(tensors[2].shape, dtype=tensors[2].dtype, device="meta")
    for fn in (kv.write, kv_torch.write_torch):
        with pytest.raises(ValueError, match="key_cache is on meta, but kernels run on"):
            fn(*tensors, **kw)


def test_the_data_checks_of_a_write_can_be_switched_off(backend):
    """Off, a duplicate slot is not looked for (the caller vouches for the slots); a
    slot outside the cache is still never written (tests/kernels/test_kv.py)."""
    args, kw = write_call(slots=[1, -1, 1])
    tensors = [torch.from_numpy(a).to(backend.device) for a in args]
    with data_checks(False):
        kv.write(*tensors, **kw)
    with pytest.raises(ValueError, match="written by tokens 0 and 2"):
        kv.write(*tensors, **kw)


# ---- copy ----------------------------------------------------------------------------

def copy_call(pairs, layers=1, dtypes=(np.float32, np.float32)):
    caches = [np.arange(4 * 2, dtype=np.float32).reshape(4, 2, 1, 1) + 10 * i for i in range(2 * layers)]
    keys = [c.astype(dtypes[0]) for c in caches[:layers]]
    values = [c.astype(dtypes[1]) for c in caches[layers:]]
    return [keys, values, np.array(pairs, np.int64).reshape(-1, 2)]


COPY_ERRORS = [
    (ValueError, "copy: block 1 is a destination twice", copy_call([[0, 1], [2, 1]])),
    (ValueError, "copy: block 1 is both a source and a destination", copy_call([[0, 1], [1, 2]])),
    (ValueError, "copy: block 2 is both a source and a destination", copy_call([[2, 3], [0, 2]])),
    (ValueError, "copy: block 4 of pair \\(0, 4\\) lies outside the caches' 4 blocks", copy_call([[0, 4]])),
    (ValueError, "copy: block -1 of pair \\(-1, 2\\) lies outside", copy_call([[1, 3], [-1, 2]])),
    (TypeError, "the caches mix float32 and float16", copy_call([[0, 1]], dtypes=(np.float32, np.float16))),
]


@pytest.mark.parametrize("error, match, args", COPY_ERRORS, ids=[e[1][:48] for e in COPY_ERRORS])
def test_bad_copies(backend, error, match, args):
    refused_everywhere("copy", error, match, args, {}, backend.device)


def test_bad_copy_shapes(backend):
    keys, values, pairs = copy_call([[0, 1]], layers=2)
    d = backend.device
    refused_everywhere("copy", ValueError, "2 key caches but 1 value caches", [keys, values[:1], pairs], {}, d)
    refused_everywhere("copy", ValueError, "block_mapping must be \\[m, 2\\] \\(src, dst\\), got shape \\(1, 3\\)",
                       [keys, values, np.zeros((1, 3), np.int64)], {}, d)
    refused_everywhere("copy", ValueError, "the caches mix shapes \\(4, 2, 1, 1\\) and \\(3, 2, 1, 1\\)",
                       [keys, [values[0], values[1][:3]], pairs], {}, d)
    refused_everywhere("copy", TypeError, "block_mapping must be int64, got int32",
                       [keys, values, pairs.astype(np.int32)], {}, d)
    refused_everywhere("copy", TypeError, "key_caches and value_caches must be lists", [keys[0], values, pairs], {}, d)


def test_no_pairs_or_no_layers_is_a_no_op(backend):
    for side in SIDES:
        args = [to_side(a, side, backend.device) for a in copy_call([])]
        FUNCTIONS["copy"][side](*args)
        FUNCTIONS["copy"][side]([], [], to_side(np.array([[0, 1]], np.int64), side, backend.device))


# ---- gather --------------------------------------------------------------------------

def gather_call(cu, table=((0, 1), (2, 2)), out_rows=8, cache_dtype=np.float32, out_dtype=np.float32,
                kv_cache_dtype="auto"):
    cache = np.arange(3 * 2, dtype=np.float32).reshape(3, 2, 1, 1).astype(cache_dtype)  # 3 blocks of Bk=2
    out = np.full((out_rows, 1, 1), 7, out_dtype)
    args = [cache, cache.copy(), np.array(table, np.int32), np.array(cu, np.int32), out, out.copy()]
    return args, {"layout": "NHD", "kv_cache_dtype": kv_cache_dtype, "k_scale": 1.0, "v_scale": 1.0}


GATHER_ERRORS = [
    (ValueError, "cu_lens\\[0\\] must be 0, got 1", gather_call([1, 2, 3])),
    (ValueError, "cu_lens decreases at request 1: 3 -> 2", gather_call([0, 3, 2])),
    (ValueError, "cu_lens\\[N\\] = 9 tokens but the outputs have 8 rows", gather_call([0, 2, 9])),
    (ValueError, "request 0 has 5 tokens but its row holds 2 blocks of 2", gather_call([0, 5])),
    (ValueError, "3 requests but the block table has only 2 rows", gather_call([0, 0, 0, 0])),
    (ValueError, "block_table\\[0, 1\\] = 3 lies outside the cache's 3 blocks", gather_call([0, 3], ((0, 3),))),
    (ValueError, "block_table\\[1, 0\\] = -1 lies outside", gather_call([0, 1, 2], ((0, 9), (-1, 0)))),
    (ValueError, "cu_lens must hold N\\+1 >= 1 entries", gather_call([])),
    (TypeError, "out_key must be float32, got float16", gather_call([0, 1], out_dtype=np.float16)),
    (TypeError, "out_key must be float32, got uint8",
     gather_call([0, 1], cache_dtype=np.uint8, out_dtype=np.uint8, kv_cache_dtype="fp8_e4m3")),
    (TypeError, '"fp8_e4m3": the caches must be uint8, got float32', gather_call([0, 1], kv_cache_dtype="fp8_e4m3")),
    (TypeError, "the caches must be float16, bfloat16 or float32, got uint8",
     gather_call([0, 1], cache_dtype=np.uint8, out_dtype=np.uint8)),
]


@pytest.mark.parametrize("error, match, call", GATHER_ERRORS, ids=[e[1][:48] for e in GATHER_ERRORS])
def test_bad_gathers(backend, error, match, call):
    args, kw = call
    refused_everywhere("gather", error, match, args, kw, backend.device)


def test_bad_gather_types(backend):
    (kc, vc, table, cu, ok, ov), kw = gather_call([0, 1])
    d = backend.device
    refused_everywhere("gather", TypeError, "cu_lens must be int32, got int64",
                       [kc, vc, table, cu.astype(np.int64), ok, ov], kw, d)
    refused_everywhere("gather", TypeError, "block_table must be int32, got int64",
                       [kc, vc, table.astype(np.int64), cu, ok, ov], kw, d)
    refused_everywhere("gather", ValueError, "out_value is \\[tokens, H, D\\] = \\[8, 1, 2\\]",
                       [kc, vc, table, cu, ok, np.zeros((8, 1, 2), np.float32)], kw, d)


def test_unread_table_entries_may_hold_anything(backend):
    """Only the columns a request reads are checked: past its length, and in the rows
    past N, any value is allowed (the harness pads with garbage)."""
    args, kw = gather_call([0, 2], table=((1, -5), (2**31 - 1, 7)))
    for side in SIDES:
        FUNCTIONS["gather"][side](*[to_side(a, side, backend.device) for a in args], **kw)


def test_the_data_checks_of_a_gather_can_be_switched_off(backend):
    args, kw = gather_call([0, 2, 9])
    tensors = [to_side(a, "triton", backend.device) for a in args]
    with data_checks(False):
        kv.gather(*tensors, **kw)  # writes only rows < 8 (the grid covers the outputs)
    with pytest.raises(ValueError, match="cu_lens\\[N\\] = 9"):
        kv.gather(*tensors, **kw)
