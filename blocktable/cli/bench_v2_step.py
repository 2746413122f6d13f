"""One serving step of vLLM's V2 block tables (docs/contract.md §10), built for the
benchmark: the persistent rows and counts of every request slot, this step's staged
writes, the batch (`idx_mapping` permuted over the slots, a few dummies, padding) and
its tokens. Everything lives on the device; the three operations' buffers are
prepared from it by blocktable.cli.bench_v2.

The numbers follow a running engine. Slots outside the batch keep rows of earlier
requests, so `idx_mapping` is a permutation of a subset of the slots. Every row holds
ids to its full width (the entries past a count are stale, as after a preemption).
The staged writes are the busiest kind of step: each decoding request crosses into a
new block in every group, each prefill chunk stages the blocks its tokens need, and a
few resumed requests overwrite their rows from column 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

INT32_MAX = 2**31 - 1
# Groups as a hybrid model has them: allocation block sizes K_g over one kernel block size.
GROUP_SIZES = {1: ([16], [16]), 4: ([16, 16, 32, 64], [16, 8, 16, 32])}


@dataclass(frozen=True)
class Shape:
    """A step's batch: `requests` entries of idx_mapping (dummies included), each real
    request decoding one token except `prefills` chunks of `prefill_tokens`."""

    name: str
    requests: int
    context: int  # the longest context, in tokens
    groups: int = 1
    min_context: int | None = None  # the shortest; default context // 2
    prefills: int = 0
    prefill_tokens: int = 0
    dummies: int = 0
    resumed: int = 0  # decoding requests that overwrite their whole rows instead
    pad_requests: int = 8  # num_reqs_padded - requests
    cp: tuple[int, int, int] = (1, 0, 1)  # DCP (W, R, I); every group sharded
    max_tokens: int | None = None  # Tmax; default max(8192, T rounded up to 1024)

    def label(self) -> str:
        W = self.cp[0]
        return f"{self.name}, {self.groups} group{'s' if self.groups > 1 else ''}" + (f", DCP {W}" if W > 1 else "")

    @property
    def tokens(self) -> int:
        """T: a token for every decode and dummy, prefill_tokens for every chunk."""
        return self.requests + self.prefills * (self.prefill_tokens - 1)


@dataclass
class Step:
    """The state and inputs of one step, on the device. `config` holds the arguments
    both BlockTables (ours and the reference) are built from."""

    shape: Shape
    config: dict[str, Any]
    widths: list[int]
    rows: list[torch.Tensor]  # int32 [Rmax, width_g]: the rows as the step begins
    cnt: torch.Tensor  # int32 [G, Rmax]: the host counts after this step's appends
    cnt_before: torch.Tensor  # int32 [G, Rmax]: cnt_dev before the apply
    staged: dict[str, torch.Tensor]  # group, row, start, ids, cu (int32)
    inp: list[torch.Tensor]  # int32 [Rmax, width_g]: the previous step's batch rows
    idx_mapping: torch.Tensor  # int32 [N]
    query_start_loc: torch.Tensor  # int32 [num_reqs_padded + 1], padded with T
    positions: torch.Tensor  # int64 [num_tokens_padded], zeros past T
    slots: torch.Tensor  # int64 [G, Tmax]: stale values
    num_reqs_padded: int
    num_tokens_padded: int
    bytes: dict[str, int] = field(default_factory=dict)  # per op, the least traffic a call moves

    @property
    def groups(self) -> int:
        return len(self.rows)

    def slot_keywords(self, group: int | None = None) -> dict[str, Any]:
        """The slot mappings' keywords, for every group or for `group` alone."""
        c = self.config
        chosen = range(self.groups) if group is None else [group]
        return {"kv_block_sizes": [c["block_sizes"][g] for g in chosen],
                "kernel_block_sizes": [c["kernel_block_sizes"][g] for g in chosen],
                "sharded": [True for _ in chosen], "enabled": [True for _ in chosen],
                "cp_world_size": c["cp_size"], "cp_rank": c["cp_rank"], "cp_interleave": c["cp_interleave"]}


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _blocks(context: np.ndarray, K: int, W: int) -> np.ndarray:
    """Allocation blocks a context of that many tokens holds on one rank (all sharded)."""
    return -(-context // (K * W))


def _local(positions: np.ndarray, K: int, W: int, R: int, I: int) -> tuple[np.ndarray, np.ndarray]:
    """(local, l): which positions this rank holds under DCP, and their local index (§10.7)."""
    if W == 1:
        return np.ones(positions.shape, dtype=bool), positions
    vbi, vbo = positions // (K * W), positions % (K * W)
    return (vbo // I) % W == R, vbi * K + (vbo // (W * I)) * I + vbo % I


def build(shape: Shape, device: Any, seed: int = 0) -> Step:
    rng = np.random.default_rng(seed)
    K, B = (list(v) for v in GROUP_SIZES[shape.groups])
    P = [k // b for k, b in zip(K, B)]
    W, R, I = shape.cp
    G, N = shape.groups, shape.requests
    real = N - shape.dummies
    num_reqs_padded = N + shape.pad_requests
    Rmax = num_reqs_padded + N // 4  # spare slots: rows of requests outside this batch
    M = [int(_blocks(np.array(shape.context), k, W)) + 1 for k in K]  # one block of slack: stale entries
    widths = [m * p for m, p in zip(M, P)]
    T = shape.tokens
    num_tokens_padded = _round_up(T, 8)
    Tmax = shape.max_tokens or max(8192, _round_up(num_tokens_padded, 1024))

    # The batch: real requests (prefill chunks first among them) and dummies, shuffled.
    kinds = np.array(["prefill"] * shape.prefills + ["decode"] * (real - shape.prefills) + ["dummy"] * shape.dummies)
    kinds = kinds[rng.permutation(N)]
    slot_of = np.full(N, -1, dtype=np.int64)
    slot_of[kinds != "dummy"] = rng.permutation(Rmax)[:real]
    query = np.where(kinds == "prefill", shape.prefill_tokens, 1).astype(np.int64)
    low = max(shape.prefill_tokens, 1, shape.min_context or shape.context // 2)
    context = np.where(kinds == "dummy", 0, rng.integers(low, shape.context + 1, size=N))
    decoding = np.flatnonzero(kinds == "decode")
    resumed = set(rng.choice(decoding, size=min(shape.resumed, len(decoding)), replace=False).tolist())

    rows = [rng.integers(0, INT32_MAX, size=(Rmax, w), dtype=np.int64).astype(np.int32) for w in widths]
    cnt = np.stack([rng.integers(0, w + 1, size=Rmax) for w in widths]).astype(np.int32)
    for g in range(G):
        live = slot_of >= 0
        cnt[g, slot_of[live]] = _blocks(context[live], K[g], W) * P[g]
    cnt_before = rng.integers(0, INT32_MAX, size=(G, Rmax), dtype=np.int64).astype(np.int32)

    writes: list[tuple[int, int, int, np.ndarray]] = []  # staging order: by request, then group
    for b in np.flatnonzero(slot_of >= 0):
        for g in range(G):
            end = int(_blocks(context[b], K[g], W))
            first = 0 if b in resumed else (end - 1 if kinds[b] == "decode"
                                            else int(_blocks(context[b] - query[b], K[g], W)))
            if end > first:
                blocks = rng.integers(0, INT32_MAX // P[g], size=end - first)
                ids = (blocks[:, None] * P[g] + np.arange(P[g])).reshape(-1)  # kernel ids of each block
                writes.append((g, int(slot_of[b]), first * P[g], ids))
    lengths = np.array([len(ids) for *_, ids in writes], dtype=np.int64)
    staged = {"group": np.array([w[0] for w in writes]), "row": np.array([w[1] for w in writes]),
              "start": np.array([w[2] for w in writes]),
              "ids": np.concatenate([ids for *_, ids in writes]) if writes else np.zeros(0),
              "cu": np.concatenate([[0], np.cumsum(lengths)])}

    qsl = np.full(num_reqs_padded + 1, T, dtype=np.int64)
    qsl[0] = 0
    qsl[1:N + 1] = np.cumsum(query)
    positions = np.zeros(num_tokens_padded, dtype=np.int64)
    positions[:T] = np.concatenate([np.arange(c - q, c) for c, q in zip(np.maximum(context, query), query)])
    inp = [rng.integers(0, INT32_MAX, size=(Rmax, w), dtype=np.int64).astype(np.int32) for w in widths]
    slots = rng.integers(-2**62, 2**62, size=(G, Tmax), dtype=np.int64)

    # The least traffic of each call: what it must read and write once.
    request = np.repeat(np.arange(N), query)
    table_entries = 0
    for g in range(G):
        local, lpos = _local(positions[:T], K[g], W, R, I)
        keep = local & (slot_of[request] >= 0)
        table_entries += len(np.unique(slot_of[request][keep] * widths[g] + lpos[keep] // B[g]))
    live = slot_of >= 0
    copied = sum(int(cnt[g, slot_of[live]].sum()) for g in range(G))
    zeroed = sum(w * (num_reqs_padded - real) for w in widths)
    E = int(lengths.sum())
    nbytes = {"append": 4 * (3 * len(writes) + len(writes) + 1 + 2 * E) + 2 * 4 * G * Rmax,
              "gather": 4 * N + 4 * G * real + 2 * 4 * copied + 4 * zeroed,
              "slots": 8 * T + 4 * (N + 1) + 4 * N + 4 * table_entries + 8 * G * Tmax}

    def up(a: np.ndarray, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(dtype).to(device)

    config = {"block_sizes": K, "max_num_reqs": Rmax, "max_num_batched_tokens": Tmax, "max_num_blocks_per_group": M,
              "kernel_block_sizes": B, "cp_size": W, "cp_rank": R, "cp_interleave": I}
    return Step(shape, config, widths, [up(r) for r in rows], up(cnt), up(cnt_before),
                {k: up(v) for k, v in staged.items()}, [up(i) for i in inp], up(slot_of),
                up(qsl), up(positions, torch.int64), up(slots, torch.int64), num_reqs_padded, num_tokens_padded,
                nbytes)
