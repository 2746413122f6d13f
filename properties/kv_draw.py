"""Random KV calls (docs/contract.md §9) for the stateless mode, as case-file data
(properties/kv_calls.py).

Each call draws its own geometry (H 1..4, D from 1..8, 16, 32, 64, 128; Bk 1..32,
not only powers of two), layout, data dtype, cache dtype and scales (powers of two,
where fp8 rounding midpoints are exact after the division, and others), how the
caches and inputs are stored (halves of one tensor, padded head rows), and sizes up
to `max_elements` per cache. The data often holds the values where encoders go
wrong: NaN of both signs, infinities, values past ±448·scale, subnormals, the exact
midpoints between fp8 codes, zeros of both signs; sometimes plain random bits.
Slots come without repeats, with negative ones, slot 0 and the cache's last slot
often; copy pairs reach the last blocks; gathers have empty requests and spare
output rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocktable.properties.kv_buffers import HOST
from blocktable.reference.fp8 import MAGNITUDES, MIDPOINTS, float32_to_bfloat16

HEAD_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128)
BLOCK_SIZES = (1, 2, 3, 4, 5, 8, 16, 32)
SCALES = (1.0, 0.5, 2.0, 0.125, 1 / 3, 0.1, 3.7, 0.0172, 123.4, 2.0**-10)


def _scale(rng: np.random.Generator) -> float:
    if rng.random() < 0.7:
        return float(rng.choice(SCALES))
    return float(np.exp(rng.uniform(-6, 6)))


def data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float) -> np.ndarray:
    """`shape` values in the reference's dtype (bfloat16 as uint16 bits)."""
    size = int(np.prod(shape))
    itemsize = np.dtype(HOST[dtype]).itemsize
    if rng.random() < 0.1:  # every bit pattern: NaN payloads, all exponents
        return rng.integers(0, 2**(8 * itemsize), size, dtype=np.uint64).astype(f"u{itemsize}").view(
            HOST[dtype]).reshape(shape)
    magnitude = float(rng.choice([1.0, 10.0, 300.0, 600.0])) * scale
    x = (rng.standard_normal(size) * magnitude).astype(np.float32)
    special_rate = float(rng.choice([0.0, 0.05, 0.3]))
    special = rng.random(size) < special_rate
    if special.any():
        with np.errstate(over="ignore"):
            picks = np.concatenate([
                np.array([0.0, 0.0, np.inf, -np.inf, 0.0, -0.0, 448.0, -448.0, 464.0, -464.0, 480.0, 1e30, -1e30,
                          2.0**-9, 2.0**-10, 2.0**-11, 6e-8, 1e-40, -1e-45]) * scale,
                MIDPOINTS * scale, -MIDPOINTS * scale, MAGNITUDES * scale]).astype(np.float32)
        picks[0], picks[1] = np.nan, np.copysign(np.float32(np.nan), np.float32(-1))  # NaN of both signs
        x[special] = rng.choice(picks, int(special.sum()))
    with np.errstate(over="ignore"):
        if dtype == "float16":
            out = x.astype(np.float16)
        elif dtype == "bfloat16":
            out = float32_to_bfloat16(x)
        else:
            out = x
    return out.reshape(shape)


def _as_bits(x: np.ndarray) -> list[int]:
    return x.view(f"u{x.dtype.itemsize}").reshape(-1).tolist()


def _common(rng: np.random.Generator, max_elements: int) -> dict[str, Any]:
    H = int(rng.integers(1, 5))
    D = int(rng.choice(HEAD_SIZES))
    Bk = int(rng.choice(BLOCK_SIZES))
    per_block = Bk * H * D
    most = max(1, max_elements // per_block)
    num_blocks = int(min(most, rng.choice([1, 2, 3, 5, 8, 17, 64, 1000, 100000])))
    kv_cache_dtype = "fp8_e4m3" if rng.random() < 0.5 else "auto"
    return {"layout": str(rng.choice(["NHD", "HND"])), "dtype": str(rng.choice(["float16", "bfloat16", "float32"])),
            "kv_cache_dtype": kv_cache_dtype, "k_scale": _scale(rng), "v_scale": _scale(rng),
            "num_blocks": num_blocks, "block_size": Bk, "num_heads": H, "head_size": D,
            "cache_form": {"joint": bool(rng.random() < 0.5), "pad": int(rng.choice([0, 0, 1, 3]))},
            "fill_seed": int(rng.integers(2**31))}


def draw_write(rng: np.random.Generator, max_elements: int, max_tokens: int) -> dict[str, Any]:
    call = {"op": "write", **_common(rng, max_elements)}
    num_slots = call["num_blocks"] * call["block_size"]
    most = min(max_tokens, num_slots + 4)  # a few more tokens than slots: some stay negative
    n = int(rng.integers(0, most + 1)) if rng.random() < 0.7 else int(rng.integers(0, min(most, 8) + 1))
    negative = rng.random(n) < float(rng.choice([0.0, 0.1, 0.5]))
    valid = int(min(n - negative.sum(), num_slots))
    if rng.random() < 0.3:  # a prefill's run of slots
        start = int(rng.integers(0, num_slots - valid + 1))
        chosen = np.arange(start, start + valid)
    else:
        chosen = rng.choice(num_slots, valid, replace=False)
        if valid and rng.random() < 0.5:
            chosen[0] = 0 if 0 not in chosen else chosen[0]
        if valid > 1 and rng.random() < 0.5 and num_slots - 1 not in chosen:
            chosen[-1] = num_slots - 1
    slots = np.full(n, -1, np.int64)
    keep = np.flatnonzero(~negative)[:valid]
    slots[keep] = chosen
    slots[slots < 0] = rng.choice([-1, -1, -1, -2, -(2**40)], int((slots < 0).sum()))
    n = len(slots)
    rows = n + int(rng.choice([0, 0, 1, 3, 17]))
    shape = (rows, call["num_heads"], call["head_size"])
    call.update(slot_mapping=slots.tolist(), rows=rows,
                key=_as_bits(data(rng, shape, call["dtype"], call["k_scale"])),
                value=_as_bits(data(rng, shape, call["dtype"], call["v_scale"])),
                input_form={"joint": bool(rng.random() < 0.4), "pad": int(rng.choice([0, 0, 1, 5]))})
    return call


def draw_copy(rng: np.random.Generator, max_elements: int) -> dict[str, Any]:
    call = {"op": "copy", **_common(rng, max_elements // 3)}
    num_blocks = call["num_blocks"] = max(2, call["num_blocks"])
    m = int(rng.integers(0, num_blocks // 2 + 1))
    order = rng.permutation(num_blocks)
    if rng.random() < 0.5:  # the last blocks, where a partial last tile or an id bound goes wrong
        order = np.concatenate([[num_blocks - 1], order[order != num_blocks - 1]])
    dst = order[:m]
    sources = order[m:]
    src = rng.choice(sources, m)  # a source may serve several destinations
    pairs = np.stack([src, dst], 1)[rng.permutation(m)]
    call.update(layers=int(rng.integers(1, 4)), block_mapping=pairs.reshape(-1, 2).astype(np.int64).tolist())
    return call


def draw_gather(rng: np.random.Generator, max_elements: int, max_tokens: int) -> dict[str, Any]:
    call = {"op": "gather", **_common(rng, max_elements)}
    Bk, num_blocks = call["block_size"], call["num_blocks"]
    max_tokens = max(1, min(max_tokens, max_elements // (call["num_heads"] * call["head_size"])))
    N = int(rng.integers(0, 9)) if rng.random() < 0.8 else int(rng.integers(9, 65))
    per = max(1, max_tokens // max(N, 1))
    lengths = rng.integers(0, per + 1, N)
    lengths[rng.random(N) < 0.2] = 0
    width = int(-(-int(lengths.max(initial=0)) // Bk)) + int(rng.choice([0, 0, 1, 4]))
    width = max(width, 1)
    if rng.random() < 0.5 and N:  # requests that fill their whole row
        lengths[rng.integers(N)] = width * Bk
    table = rng.integers(0, num_blocks, (N + int(rng.choice([0, 0, 1, 3])), width))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    call.update(block_table=table.tolist(), width=width, cu_lens=cu.tolist(),
                out_rows=int(cu[-1]) + int(rng.choice([0, 1, 1, 5])), out_pad=int(rng.choice([0, 0, 1, 3])))
    return call


def draw(op: str, rng: np.random.Generator, max_elements: int, max_tokens: int) -> dict[str, Any]:
    if op == "write":
        return draw_write(rng, max_elements, max_tokens)
    if op == "copy":
        return draw_copy(rng, max_elements)
    return draw_gather(rng, max_elements, max_tokens)
