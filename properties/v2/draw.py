"""Random V2 block-table calls (docs/contract.md §10) for the stateless mode, as
case-file data (v2/call.py), and the smaller calls a failing one shrinks to.

Every call draws its own configuration: 1 to 4 groups with different block sizes
(`B_g` from 1 to 32, `P_g = K_g / B_g` up to 4), rows of up to `max_width` entries,
`max_num_reqs` up to a few hundred, DCP with `W` up to 8, any rank, an interleave
that is often the whole block (where ownership decided on kernel blocks goes wrong,
vLLM #51031), groups sharded or replicated, enabled or not. The state before the call
is drawn from seeds (v2/truth.py), and so is how every 2-D tensor sits in its buffer.

- append: the host calls that stage the writes: several to the same few slots,
  overwrites mixed in (a later write often covers an earlier one: the later wins),
  lengths up to the row's end, ids up to the last that fits 2**31-1 and zeros;
- gather: an idx_mapping permuted over the slots, with duplicates and -1 dummies,
  num_reqs_padded often past N;
- slots: an idx_mapping likewise, requests from empty to long prefills whose
  positions run up to and past the row's end, or lie scattered (some huge), a
  query_start_loc and positions with entries past N and T that are never read, and
  num_tokens_padded and max_num_batched_tokens past T.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from blocktable.properties.compare import Discrepancy
from blocktable.properties.v2.call import run_v2_call
from blocktable.properties.v2.compare import V2Element
from blocktable.properties.v2.truth import before, loaded, plan, widths

KERNEL_BLOCKS = (1, 2, 3, 4, 5, 8, 16, 32)
PER_BLOCK = (1, 1, 2, 2, 4)  # P_g
BLOCKS_PER_ROW = (1, 2, 3, 4, 5, 8, 16, 33, 64, 128)
MAX_NUM_REQS = (1, 2, 3, 5, 8, 16, 64, 200, 300, 512)


@dataclass(frozen=True)
class Limits:
    """How large a call may be: under the interpreter each Triton program is numpy."""

    max_num_reqs: int
    max_width: int
    max_tokens: int
    max_requests: int


INTERPRETED = Limits(max_num_reqs=300, max_width=128, max_tokens=1024, max_requests=48)
COMPILED = Limits(max_num_reqs=512, max_width=512, max_tokens=1 << 14, max_requests=512)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def draw_config(rng: np.random.Generator, limits: Limits) -> dict[str, Any]:
    G = int(rng.integers(1, 5))
    kernel, kv = [], []
    for _ in range(G):
        for _attempt in range(4):  # groups with different block sizes, mostly
            B, P = int(rng.choice(KERNEL_BLOCKS)), int(rng.choice(PER_BLOCK))
            if B * P not in kv:
                break
        kernel.append(B)
        kv.append(B * P)
    W = int(rng.choice([1, 1, 1, 2, 2, 4, 8]))
    sharded = [bool(rng.random() < 0.7) for _ in range(G)]
    enabled = [bool(rng.random() < 0.85) for _ in range(G)]
    shared = math.gcd(*[k for k, s in zip(kv, sharded) if s])
    if W > 1 and shared:
        options = _divisors(shared)
        interleave = shared if rng.random() < 0.4 else int(rng.choice(options))
    else:  # the interleave is never read: any value is valid
        interleave = int(rng.choice([1, 2, 3, 16, 64, 1000]))
    per_row = [max(1, min(limits.max_width // (k // b), int(rng.choice(BLOCKS_PER_ROW)))) for k, b in zip(kv, kernel)]
    return {"block_sizes": kv, "kernel_block_sizes": kernel, "max_num_blocks_per_group": per_row,
            "max_num_reqs": int(min(limits.max_num_reqs, rng.choice(MAX_NUM_REQS))), "max_num_batched_tokens": 1,
            "cp_size": W, "cp_rank": int(rng.integers(0, W)), "cp_interleave": interleave,
            "dcp_sharded": sharded, "slot_mapping_enabled": enabled}


def draw_layout(rng: np.random.Generator) -> dict[str, Any]:
    aligned = bool(rng.random() < 0.7)
    return {"lead_rows": int(rng.choice([0, 1, 2])),
            "lead_cols": int(rng.choice([0, 4])) if aligned else int(rng.integers(0, 4)),
            "pad": int(rng.choice([0, 0, 1, 3, 8])), "aligned": aligned}


def _common(op: str, rng: np.random.Generator, limits: Limits) -> dict[str, Any]:
    config = draw_config(rng, limits)
    return {"op": op, "name": f"stateless-{op}-call", "config": config,
            "group_seeds": [int(s) for s in rng.integers(0, 2**31, len(config["block_sizes"]))],
            "synced": bool(rng.random() < 0.7), "fill_seed": int(rng.integers(0, 2**31)),
            "layout": draw_layout(rng)}


def allocation_ids(rng: np.random.Generator, n: int, P: int) -> list[int]:
    """n allocation block ids whose kernel ids fit int32: zeros, the last ones that
    fit, small ones and anything between."""
    top = (2**31 - P) // P  # the largest b with b*P + P - 1 <= 2**31 - 1
    ids = rng.integers(0, top + 1, n)
    pick = rng.random(n)
    ids = np.where(pick < 0.05, 0, ids)
    ids = np.where((pick >= 0.05) & (pick < 0.15), top - rng.integers(0, 4, n), ids)
    ids = np.where((pick >= 0.15) & (pick < 0.4), rng.integers(0, 1000, n), ids)
    return [int(b) for b in np.clip(ids, 0, top)]


def draw_append(rng: np.random.Generator, limits: Limits) -> dict[str, Any]:
    call = _common("append", rng, limits)
    config = call["config"]
    Rmax, width = config["max_num_reqs"], widths(config)
    P = [k // b for k, b in zip(config["block_sizes"], config["kernel_block_sizes"])]
    ref = loaded(call, before(call))
    pool = rng.choice(Rmax, size=min(Rmax, int(rng.integers(1, 9))), replace=False)
    appends = []
    for _ in range(int(rng.choice([0, 1, 2, 3, 5, 8, 16, 40]))):
        r = int(rng.choice(pool)) if rng.random() < 0.8 else int(rng.integers(0, Rmax))
        overwrite = bool(rng.random() < 0.5)
        ids = []
        for g in range(len(width)):
            start = 0 if overwrite else int(ref.cnt[g, r])
            room = (width[g] - start) // P[g]
            pick = rng.random()
            n = 0 if pick < 0.2 else room if pick < 0.4 else int(rng.integers(0, room + 1))
            ids.append(allocation_ids(rng, n, P[g]))
        ref.append_block_ids(r, ids, overwrite)
        appends.append({"slot": r, "ids": ids, "overwrite": overwrite})
    call["config"]["max_num_batched_tokens"] = int(rng.integers(1, 65))
    call["appends"] = appends
    return call


def _idx_mapping(rng: np.random.Generator, N: int, Rmax: int) -> list[int]:
    """N batch positions over a permutation of the slots, with duplicates and dummies."""
    idx = rng.permutation(Rmax)[:N] if N <= Rmax else rng.integers(0, Rmax, N)
    idx = np.resize(idx, N)
    repeat = rng.random(N) < float(rng.choice([0.0, 0.2, 0.5]))
    if N:
        idx = np.where(repeat, idx[rng.integers(0, N, N)], idx)
    dummy = rng.random(N) < float(rng.choice([0.0, 0.1, 0.3]))
    return [int(r) for r in np.where(dummy, -1, idx)]


def draw_gather(rng: np.random.Generator, limits: Limits) -> dict[str, Any]:
    call = _common("gather", rng, limits)
    Rmax = call["config"]["max_num_reqs"]
    N = int(rng.integers(0, min(Rmax, 8) + 1)) if rng.random() < 0.5 else int(rng.integers(0, Rmax + 1))
    padded = N if rng.random() < 0.3 else int(rng.integers(N, Rmax + 1))
    call["config"]["max_num_batched_tokens"] = int(rng.integers(1, 65))
    call.update(idx_mapping=_idx_mapping(rng, N, Rmax), idx_dtype=str(rng.choice(["int32", "int64"])),
                num_reqs_padded=padded)
    return call


def _positions(rng: np.random.Generator, n: int, capacity: int) -> list[int]:
    """One request's positions: a run up to and past the row's end, a run from 0, or
    scattered ones (a few huge)."""
    style = rng.random()
    if style < 0.45:  # a chunk or a decode that ends near the row's end
        start = max(0, capacity - int(rng.integers(0, n + 9)))
        return list(range(start, start + n))
    if style < 0.7:
        start = int(rng.integers(0, capacity + 1)) if rng.random() < 0.5 else 0
        return list(range(start, start + n))
    p = rng.integers(0, capacity + capacity // 4 + 2, n)
    huge = rng.random(n) < 0.05
    p = np.where(huge, rng.choice([2**31, 2**40 + 3, 2**63 - 1], n), p)
    return [int(x) for x in p]


def draw_slots(rng: np.random.Generator, limits: Limits) -> dict[str, Any]:
    call = _common("slots", rng, limits)
    config = call["config"]
    Rmax, width = config["max_num_reqs"], widths(config)
    W = config["cp_size"]
    N = int(rng.integers(0, min(Rmax, limits.max_requests) + 1))
    budget = int(rng.integers(0, limits.max_tokens + 1))
    qsl: list[int] = [0]
    positions: list[int] = []
    for _ in range(N):
        kind = rng.random()
        n = 0 if kind < 0.1 else 1 if kind < 0.4 else int(rng.integers(1, 65)) if kind < 0.8 else \
            int(rng.integers(64, 513))
        n = max(0, min(n, budget - len(positions)))
        g = int(rng.integers(0, len(width)))  # the group whose row's end the positions run to
        sharded = config["dcp_sharded"][g] and W > 1
        capacity = width[g] * config["kernel_block_sizes"][g] * (W if sharded else 1)
        positions += _positions(rng, n, capacity)
        qsl.append(len(positions))
    T = len(positions)
    # Entries never read: past N in query_start_loc (anything, decreasing too) and past T in positions.
    qsl += [int(v) for v in rng.integers(-2**31, 2**31, int(rng.choice([0, 0, 1, 3])))]
    positions += [int(v) for v in rng.integers(-2**62, 2**62, int(rng.choice([0, 0, 1, 3])))]
    padded = T + int(rng.choice([0, 0, 1, 7, 64]))
    config["max_num_batched_tokens"] = max(1, padded + int(rng.choice([0, 0, 1, 16])))
    call.update(idx_mapping=_idx_mapping(rng, N, Rmax), idx_dtype=str(rng.choice(["int32", "int64"])),
                query_start_loc=qsl, positions=positions, num_tokens_padded=padded)
    return call


def draw(op: str, rng: np.random.Generator, limits: Limits) -> dict[str, Any]:
    if op == "append":
        return draw_append(rng, limits)
    if op == "gather":
        return draw_gather(rng, limits)
    return draw_slots(rng, limits)


def call_size(call: dict[str, Any]) -> int:
    """Ids staged, rows gathered or tokens mapped: what the progress line counts."""
    if call["op"] == "append":
        return sum(len(ids) for a in call["appends"] for ids in a["ids"])
    if call["op"] == "gather":
        return call["num_reqs_padded"] * len(call["config"]["block_sizes"])
    return call["num_tokens_padded"] * len(call["config"]["block_sizes"])


# -- shrinking a failing call ---------------------------------------------------------

NEIGHBOURHOOD = 4  # appends or requests on each side of the failing one
ROUNDS = 12


def keep_groups(call: dict[str, Any], groups: list[int]) -> dict[str, Any]:
    """The call with only these groups (their state as it was)."""
    config = dict(call["config"])
    for key in ("block_sizes", "kernel_block_sizes", "max_num_blocks_per_group", "dcp_sharded",
                "slot_mapping_enabled"):
        config[key] = [config[key][g] for g in groups]
    part = dict(call, config=config, group_seeds=[call["group_seeds"][g] for g in groups])
    if call["op"] == "append":
        part["appends"] = [dict(a, ids=[a["ids"][g] for g in groups]) for a in call["appends"]]
    return part


def _around(i: int, count: int) -> list[int]:
    return list(range(max(0, i - NEIGHBOURHOOD), min(count, i + NEIGHBOURHOOD + 1)))


def _append_candidates(call: dict[str, Any], d: V2Element | None) -> list[dict[str, Any]]:
    appends = call["appends"]
    if not appends:
        return []
    out = []
    if d is None or d.buffer == "cnt_dev":
        out.append(dict(call, name="stateless-append-nothing", appends=[]))
    if d is not None and d.buffer == "rows" and d.column is not None:
        planned = plan(call)
        covering = [i for i, (g, r, start, ids) in enumerate(planned.staged)
                    if g == d.group and r == d.slot and start <= d.column < start + len(ids)]
        if covering:
            i = covering[-1]
            j = planned.origin[i]
            g, _, start, _ = planned.staged[i]
            P = call["config"]["block_sizes"][g] // call["config"]["kernel_block_sizes"][g]
            through = (d.column - start) // P + 1  # the allocation blocks up to the differing column
            ids = [list(x) if h != g else list(x[:through]) for h, x in enumerate(appends[j]["ids"])]
            out.append(dict(call, name="stateless-append-write", appends=[dict(appends[j], ids=ids)]))
            out.append(dict(call, name="stateless-append-one", appends=[appends[j]]))
            out.append(dict(call, name="stateless-append-neighbourhood",
                            appends=[appends[k] for k in _around(j, len(appends))]))
    if d is not None:
        out.append(dict(call, name="stateless-append-slot", appends=[a for a in appends if a["slot"] == d.slot]))
        if len(appends) <= 16:  # one append fewer
            out += [dict(call, name="stateless-append-fewer", appends=appends[:j] + appends[j + 1:])
                    for j in range(len(appends))]
        return out
    # No element to go by (the kernel raised): one append at a time, then halves.
    if len(appends) == 1:
        out.append(dict(call, name="stateless-append-first-ids",
                        appends=[dict(appends[0], ids=[ids[:1] for ids in appends[0]["ids"]])]))
    out += [dict(call, name="stateless-append-one", appends=[a]) for a in appends[:12]]
    if len(appends) > 1:
        half = len(appends) // 2
        out += [dict(call, name="stateless-append-half", appends=appends[:half]),
                dict(call, name="stateless-append-half", appends=appends[half:])]
    return out


def _gather_part(call: dict[str, Any], batch: list[int], name: str) -> dict[str, Any]:
    N, padded = len(call["idx_mapping"]), call["num_reqs_padded"]
    return dict(call, name=name, idx_mapping=[call["idx_mapping"][b] for b in batch],
                num_reqs_padded=len(batch) + padded - N)


def _gather_candidates(call: dict[str, Any], d: V2Element | None) -> list[dict[str, Any]]:
    N, padded = len(call["idx_mapping"]), call["num_reqs_padded"]
    b = d.batch if d is not None and d.batch is not None else 0
    out = []
    if b < N:
        out += [dict(_gather_part(call, [b], "stateless-gather-request"), num_reqs_padded=1),
                _gather_part(call, [b], "stateless-gather-request-padded"),
                _gather_part(call, _around(b, N), "stateless-gather-neighbourhood")]
    else:
        out += [dict(call, name="stateless-gather-padding", idx_mapping=[], num_reqs_padded=min(padded, b - N + 1)),
                dict(call, name="stateless-gather-padding", idx_mapping=[], num_reqs_padded=padded - N)]
    if N > 1:
        out.append(_gather_part(call, list(range(N // 2)), "stateless-gather-half"))
    return out


def _slots_part(call: dict[str, Any], requests: list[int], name: str,
                token: int | None = None) -> dict[str, Any]:
    """The call cut to `requests` (or to one token of one), packed from token 0, with
    the entries past N and T and the padding past T kept."""
    N = len(call["idx_mapping"])
    qsl, positions = call["query_start_loc"], call["positions"]
    T = qsl[N]
    tokens = [token] if token is not None else [t for b in requests for t in range(qsl[b], qsl[b + 1])]
    lengths = [1] if token is not None else [qsl[b + 1] - qsl[b] for b in requests]
    starts = [0] + [int(x) for x in np.cumsum(lengths, dtype=np.int64)]
    return dict(call, name=name, idx_mapping=[call["idx_mapping"][b] for b in requests],
                query_start_loc=starts + qsl[N + 1:], positions=[positions[t] for t in tokens] + positions[T:],
                num_tokens_padded=len(tokens) + call["num_tokens_padded"] - T)


def _slots_candidates(call: dict[str, Any], d: V2Element | None) -> list[dict[str, Any]]:
    N = len(call["idx_mapping"])
    T = call["query_start_loc"][N]
    t = d.token if d is not None and d.token is not None else 0
    out = []
    if t < T and d is not None and d.batch is not None:
        b = d.batch
        out += [_slots_part(call, [b], "stateless-slots-token", t), _slots_part(call, [b], "stateless-slots-request"),
                _slots_part(call, _around(b, N), "stateless-slots-neighbourhood")]
    else:
        out += [_slots_part(call, [], "stateless-slots-pad")]
        if N:
            out.append(_slots_part(call, [0], "stateless-slots-pad-one-request"))
    if N > 1:
        out.append(_slots_part(call, list(range(N // 2)), "stateless-slots-half"))
    return out


def candidates(call: dict[str, Any], error: BaseException | None) -> list[dict[str, Any]]:
    """Smaller calls to try, smallest first: each with only the failing group first."""
    d = error.detail if isinstance(error, Discrepancy) and isinstance(error.detail, V2Element) else None
    op = call["op"]
    smaller = (_append_candidates if op == "append" else _gather_candidates if op == "gather"
               else _slots_candidates)(call, d)
    G = len(call["config"]["block_sizes"])
    out = []
    for part in smaller:
        if G > 1 and d is not None:
            out.append(keep_groups(part, [d.group]))
        out.append(part)
    if G > 1:
        out += [keep_groups(call, [g]) for g in ([d.group] if d is not None else range(G))]
    return out


def _refused(call: dict[str, Any]) -> bool:
    """The reference refuses it: no kernel would be called with it."""
    try:
        plan(call)
    except (TypeError, ValueError):
        return True
    return False


def shrink(call: dict[str, Any], error: BaseException | None, kernel: Callable, device: Any) -> dict[str, Any]:
    """A smaller call that still fails (the call itself if none does): the first
    failing candidate, then its own candidates, a few rounds."""
    current, seen = call, {_key(call)}
    for _ in range(ROUNDS):
        for part in candidates(current, error):
            key = _key(part)
            if key in seen or _refused(part):
                continue
            seen.add(key)
            outcome = run_v2_call(part, kernel, device)
            if not outcome.passed:
                current, error = part, outcome.error
                break
        else:
            break
    return current


def _key(call: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in call.items() if k != "name"}, sort_keys=True)
