"""docs/contract.md §1-§2: sizes, the DCP configuration of one KV-cache group, and row width."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

PAD_SLOT_ID = -1  # slot mappings only
NULL_BLOCK_ID = 0  # block-table padding; the pool never hands block 0 out (null_block=True)
INT32_MAX = 2**31 - 1


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


@dataclass(frozen=True)
class GroupLayout:
    """How one KV-cache group lays tokens into blocks (docs/contract.md §1).

    kv_block_size (K) is the allocation block, kernel_block_size (B) the block the
    attention kernel indexes. A sharded group splits tokens over the DCP ranks
    (world size W, interleave I); a replicated group keeps every token on every rank,
    so for it W is 1 in every formula.
    """

    kv_block_size: int
    kernel_block_size: int
    sharded: bool = True
    cp_world_size: int = 1
    cp_interleave: int = 1

    def __post_init__(self) -> None:
        K, B, W, I = self.kv_block_size, self.kernel_block_size, self.cp_world_size, self.cp_interleave
        for name, value in (("kv_block_size", K), ("kernel_block_size", B),
                            ("cp_world_size", W), ("cp_interleave", I)):
            if type(value) is not int:
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if K % B != 0:
            raise ValueError(f"kv_block_size {K} is not a multiple of kernel_block_size {B}")
        if not (1 <= I <= K and K % I == 0):
            raise ValueError(f"cp_interleave {I} must divide kv_block_size {K} (1 <= I <= K)")

    @property
    def kernel_blocks_per_block(self) -> int:
        """P = K // B; the table is "hybrid" when P > 1."""
        return self.kv_block_size // self.kernel_block_size

    @property
    def world(self) -> int:
        """The W that the formulas use: 1 for a replicated group."""
        return self.cp_world_size if self.sharded else 1

    @property
    def interleave(self) -> int:
        """The I that the formulas use; irrelevant (1) when W is 1."""
        return self.cp_interleave if self.sharded else 1

    @property
    def tokens_per_block(self) -> int:
        """Tokens one allocation block id covers across all ranks: K * W."""
        return self.kv_block_size * self.world

    def row_width(self, max_model_len: int) -> int:
        return row_width(max_model_len, self.kv_block_size, self.kernel_block_size, self.world)


def row_width(max_model_len: int, kv_block_size: int, kernel_block_size: int, cp_world_size: int = 1) -> int:
    """docs/contract.md §2: width = cdiv(cdiv(max_model_len, K*W), align) * align * P,
    with vLLM's align = 128 // gcd(128, K): a row covers a multiple of 128 tokens."""
    if type(max_model_len) is not int or max_model_len < 1:
        raise ValueError(f"max_model_len must be a positive int, got {max_model_len!r}")
    K, B, W = kv_block_size, kernel_block_size, cp_world_size
    if K % B != 0:
        raise ValueError(f"kv_block_size {K} is not a multiple of kernel_block_size {B}")
    align = 128 // math.gcd(128, K)
    P = K // B
    return cdiv(cdiv(max_model_len, K * W), align) * align * P


def map_to_kernel_blocks(ids: Sequence[int], kernel_blocks_per_block: int) -> list[int]:
    """docs/contract.md §3: allocation block b -> kernel blocks b*P, b*P+1, ..., b*P+P-1, in order."""
    P = kernel_blocks_per_block
    out: list[int] = []
    for b in ids:
        for j in range(P):
            out.append(b * P + j)
    return out
