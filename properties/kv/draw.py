"""Random KV calls (docs/contract.md §9) for the stateless mode, as case-file data
(kv/call.py), and the smaller calls a failing one shrinks to.

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

from collections.abc import Callable
from typing import Any

import numpy as np

from blocktable.properties.kv.call import run_kv_call
from blocktable.properties.kv.compare import CacheDiscrepancy, RowsDiscrepancy
from blocktable.properties.kv.data import HOST
from blocktable.reference.fp8 import MAGNITUDES, MIDPOINTS, float32_to_bfloat16

MAX_HEADS = 4  # H is drawn from 1..MAX_HEADS
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
    out: np.ndarray
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
    H = int(rng.integers(1, MAX_HEADS + 1))
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


# -- shrinking a failing call ---------------------------------------------------------

NEIGHBOURHOOD = 8  # tokens (pairs, requests) on each side of the failing one


def call_size(call: dict[str, Any]) -> int:
    """Tokens written, pairs copied or rows gathered: what the progress line counts."""
    if call["op"] == "write":
        return len(call["slot_mapping"])
    if call["op"] == "copy":
        return len(call["block_mapping"]) * call["layers"]
    return call["cu_lens"][-1]


def _write_part(call: dict[str, Any], tokens: list[int], name: str) -> dict[str, Any]:
    """The call cut to `tokens` (in order), the padding rows kept behind them."""
    n, rows = len(call["slot_mapping"]), call["rows"]
    keep = list(tokens) + list(range(n, rows))
    part = dict(call, name=name, slot_mapping=[call["slot_mapping"][t] for t in tokens], rows=len(keep))
    for v in ("key", "value"):
        data = np.array(call[v], dtype=np.uint64).reshape(rows, -1)
        part[v] = data[keep].reshape(-1).tolist()
    return part


def _gather_part(call: dict[str, Any], requests: list[int], name: str) -> dict[str, Any]:
    """The call cut to `requests`, packed from row 0, with the same spare output rows."""
    cu = call["cu_lens"]
    lengths = [cu[r + 1] - cu[r] for r in requests]
    new_cu = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(int).tolist()
    spare = call["out_rows"] - cu[-1]
    return dict(call, name=name, block_table=[call["block_table"][r] for r in requests], cu_lens=new_cu,
                out_rows=new_cu[-1] + spare)


def _around(i: int, count: int) -> list[int]:
    return list(range(max(0, i - NEIGHBOURHOOD), min(count, i + NEIGHBOURHOOD + 1)))


def candidates(call: dict[str, Any], error: BaseException | None) -> list[dict[str, Any]]:
    """Smaller calls to try, smallest first; the whole call last."""
    op = call["op"]
    out: list[dict[str, Any]] = []
    if op == "write":
        slots = call["slot_mapping"]
        slot = error.slot if isinstance(error, CacheDiscrepancy) else None
        t = slots.index(slot) if slot in slots else 0
        if slots:
            out += [_write_part(call, [t], "stateless-write-token"),
                    _write_part(call, _around(t, len(slots)), "stateless-write-neighbourhood")]
    elif op == "copy":
        pairs = call["block_mapping"]
        dsts = [d for _, d in pairs]
        block = error.block if isinstance(error, CacheDiscrepancy) else None
        i = dsts.index(block) if block in dsts else 0
        if pairs:
            out += [dict(call, name="stateless-copy-pair", block_mapping=[pairs[i]]),
                    dict(call, name="stateless-copy-neighbourhood",
                         block_mapping=[pairs[j] for j in _around(i, len(pairs))])]
            if call["layers"] > 1:
                out.insert(0, dict(call, name="stateless-copy-pair-one-layer", block_mapping=[pairs[i]], layers=1))
    else:
        cu = call["cu_lens"]
        N = len(cu) - 1
        row = error.row if isinstance(error, RowsDiscrepancy) else None
        r = N - 1 if row is None or row >= cu[-1] else int(np.searchsorted(cu, row, side="right")) - 1
        if N:
            out += [_gather_part(call, [r], "stateless-gather-request"),
                    _gather_part(call, _around(r, N), "stateless-gather-neighbourhood")]
    out.append(dict(call, name=f"stateless-{op}-call"))
    return out


def shrink(call: dict[str, Any], error: BaseException | None, kernel: Callable, device: Any,
           strict_nan: bool = False) -> dict[str, Any]:
    """The first candidate that still fails (the whole call if none smaller does)."""
    options = candidates(call, error)
    for part in options[:-1]:
        if not run_kv_call(part, kernel, device, strict_nan).passed:
            return part
    return options[-1]
