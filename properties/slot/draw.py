"""Draws of one slot-mapping call (docs/contract.md §4): the Hypothesis strategies the
tests use (configurations, tables, queries), the stateless fuzzer's large random
batches made on the device, and the smaller calls a failing batch shrinks to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from blocktable.device import Backend
from blocktable.properties.slot.call import run_slot_call, slot_call
from blocktable.reference.layout import INT32_MAX


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SlotConfig:
    """K, B, W, R, I of one slot-mapping call (docs/contract.md §1)."""

    kv_block_size: int
    kernel_block_size: int
    cp_world_size: int = 1
    cp_rank: int = 0
    cp_interleave: int = 1

    def kwargs(self) -> dict[str, int]:
        return dict(kv_block_size=self.kv_block_size, kernel_block_size=self.kernel_block_size,
                    cp_world_size=self.cp_world_size, cp_rank=self.cp_rank, cp_interleave=self.cp_interleave)


@st.composite
def slot_configs(draw: st.DrawFn, max_world: int = 8) -> SlotConfig:
    """Any valid (K, B, W, R, I): B a power of two up to 64, K = B times 1-4 (hybrid
    tables when > 1), W in {1, 2, 4, 8}, every rank, I any divisor of K, so that
    I > B (the ownership bug of kernel-block coordinates) comes up often."""
    B = draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
    K = B * draw(st.sampled_from([1, 2, 3, 4]))
    W = draw(st.sampled_from([w for w in (1, 2, 4, 8) if w <= max_world]))
    R = draw(st.integers(0, W - 1))
    I = draw(st.sampled_from(divisors(K)))
    return SlotConfig(K, B, W, R, I)


def block_ids(max_id: int = INT32_MAX) -> st.SearchStrategy[int]:
    """Table entries: mostly small, often block 0, and often near 2**31-1 where an
    int32 product of id and block size would wrap."""
    return st.one_of(st.integers(0, 64), st.just(0), st.integers(max(0, max_id - 64), max_id))


@dataclass(frozen=True)
class SlotCase:
    """One stateless slot-mapping call: inputs as numpy arrays, plus the config."""

    config: SlotConfig
    query_start_loc: np.ndarray  # int32 [N+1]
    positions: np.ndarray  # int64 [T]
    block_table: np.ndarray  # int32 [rows, width]
    max_num_tokens: int

    @property
    def num_tokens(self) -> int:
        return len(self.positions)


@st.composite
def slot_cases(draw: st.DrawFn, max_requests: int = 5, max_query: int = 24, max_width: int = 12,
               max_world: int = 8) -> SlotCase:
    """Random block tables, query layouts and positions. Positions run up to two
    blocks past the row (the out-of-row guard), requests may be empty, N may be 0,
    T may equal Tmax, and rows past N exist (a kernel must never read them)."""
    config = draw(slot_configs(max_world))
    K, B, W = config.kv_block_size, config.kernel_block_size, config.cp_world_size
    width = draw(st.integers(0, max_width))
    N = draw(st.integers(0, max_requests))
    rows = N + draw(st.integers(0, 2))
    table = np.array(draw(st.lists(block_ids(), min_size=rows * width, max_size=rows * width)),
                     dtype=np.int32).reshape(rows, width)
    tokens_per_row = max(1, width // (K // B)) * K * W if width else K * W
    limit = tokens_per_row + 2 * K * W
    positions: list[int] = []
    lengths = []
    for _ in range(N):
        q = draw(st.integers(0, max_query))
        lengths.append(q)
        if draw(st.booleans()):  # a contiguous chunk, as the scheduler makes
            start = draw(st.integers(0, limit))
            positions.extend(range(start, start + q))
        else:
            positions.extend(draw(st.lists(st.integers(0, limit), min_size=q, max_size=q)))
    qsl = np.zeros(N + 1, dtype=np.int32)
    qsl[1:] = np.cumsum(lengths, dtype=np.int64)
    T = len(positions)
    tmax = T + draw(st.sampled_from([0, 1, 7, 33]))
    return SlotCase(config, qsl, np.array(positions, dtype=np.int64), table, tmax)


# -- the stateless fuzzer's batches ----------------------------------------------------

def random_call(rng: np.random.Generator, gen: torch.Generator, device: torch.device,
                max_tokens: int) -> tuple[dict[str, int], torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(config, query_start_loc, positions, block_table, Tmax), big arrays made on the device."""
    B = int(rng.choice([1, 2, 4, 8, 16, 32, 64, 128]))
    K = B * int(rng.choice([1, 2, 3, 4]))
    W = int(rng.choice([1, 1, 2, 4, 8]))
    config = dict(kv_block_size=K, kernel_block_size=B, cp_world_size=W, cp_rank=int(rng.integers(W)),
                  cp_interleave=int(rng.choice(divisors(K))))
    shape = rng.choice(["decode", "mixed", "prefill"])
    T_target = int(rng.integers(1, max_tokens + 1))
    if shape == "decode":
        lengths = np.ones(min(T_target, 4096), dtype=np.int64)
    elif shape == "mixed":
        lengths = rng.integers(0, 2 * max(1, T_target // 64) + 1, size=int(rng.integers(1, 257)))
    else:
        lengths = rng.integers(0, max(1, T_target // 4) + 1, size=int(rng.integers(1, 9)))
    N = len(lengths)
    qsl = np.zeros(N + 1, dtype=np.int64)
    qsl[1:] = np.cumsum(lengths)
    T = int(qsl[-1])
    width = int(rng.integers(1, 257))
    rows = N + int(rng.integers(0, 4))
    table = torch.randint(0, 4096, (rows, width), generator=gen, device=device, dtype=torch.int64)
    high = torch.rand((rows, width), generator=gen, device=device) < 0.3
    table = torch.where(high, INT32_MAX - table, table)  # ids near 2**31-1: the int64 rule
    table = torch.where(torch.rand((rows, width), generator=gen, device=device) < 0.05, 0, table).to(torch.int32)
    qsl_t = torch.from_numpy(qsl.astype(np.int32)).to(device)
    if T:
        request = torch.repeat_interleave(torch.arange(N, device=device), torch.from_numpy(lengths).to(device))
        offset = torch.arange(T, device=device) - qsl_t[:-1].long()[request]
        reach = (width // (K // B) + 2) * K * W + 1  # up to two virtual blocks past the row
        start = torch.randint(0, reach, (N,), generator=gen, device=device)
        scattered = torch.rand(N, generator=gen, device=device) < 0.3
        random_pos = torch.randint(0, reach, (T,), generator=gen, device=device)
        positions = torch.where(scattered[request], random_pos, start[request] + offset)
    else:
        positions = torch.zeros(0, dtype=torch.int64, device=device)
    tmax = T + int(rng.choice([0, 1, 7, 64]))
    return config, qsl_t, positions.contiguous(), table, tmax


def shrink(kernel: Any, backend: Backend, config: dict[str, int], qsl: torch.Tensor, positions: torch.Tensor,
           table: torch.Tensor, tmax: int, token: int) -> dict[str, Any]:
    """The smallest of: the failing token alone, its request alone, the whole batch,
    that still fails through run_slot_call."""
    qsl_np, pos_np, table_np = qsl.cpu().numpy(), positions.cpu().numpy(), table.cpu().numpy()
    T = len(pos_np)
    candidates = []
    if token >= T:  # the tail: no requests at all
        candidates.append(slot_call("stateless-tail", config, np.zeros(1, np.int32), np.zeros(0, np.int64),
                                    table_np[:1], 2))
    else:
        r = int(np.searchsorted(qsl_np, token, side="right")) - 1
        first, last = int(qsl_np[r]), int(qsl_np[r + 1])
        one = pos_np[token:token + 1].copy()
        whole = pos_np[first:last].copy()
        # Alone in row 0, then at its own request index behind empty requests (some
        # bugs depend on which request or row it is).
        behind = np.zeros(r + 2, np.int32)
        candidates += [
            slot_call("stateless-token", config, np.array([0, 1], np.int32), one, table_np[r:r + 1], 2),
            slot_call("stateless-token-in-place", config, np.append(behind[:-1], 1).astype(np.int32), one,
                      table_np[:r + 1], 2),
            slot_call("stateless-request", config, np.array([0, last - first], np.int32), whole,
                      table_np[r:r + 1], last - first + 1),
            slot_call("stateless-request-in-place", config, np.append(behind[:-1], last - first).astype(np.int32),
                      whole, table_np[:r + 1], last - first + 1),
        ]
    candidates.append(slot_call("stateless-batch", config, qsl_np, pos_np, table_np, tmax))
    for call in candidates:
        if not run_slot_call(call, kernel, backend).passed:
            return call
    return candidates[-1]
