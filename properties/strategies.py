"""Every Hypothesis strategy of the harness, each documented with what it aims at.

Strategies draw plain data (ints, lists, numpy arrays); turning them into tensors
is the caller's business, so the same draw feeds the reference and any kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

INT32_MAX = 2**31 - 1


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class SlotConfig:
    """K, B, W, R, I of one slot-mapping call (SPEC §1)."""

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
