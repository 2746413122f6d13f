"""docs/contract.md §4's worked examples as data, each expected value computed by hand.

The arithmetic is in the comments: these numbers come from docs/contract.md, never from
running the reference or a kernel. Tests run every example through the reference,
our Triton kernel and any plugged-in kernel; `blocktable fuzz` runs them first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from blocktable.properties.slot.call import slot_call


@dataclass(frozen=True)
class SlotExample:
    name: str
    kv_block_size: int  # K
    kernel_block_size: int  # B
    rows: tuple[tuple[int, ...], ...]  # kernel block ids per request row, zero-padded to width
    positions: tuple[tuple[int, ...], ...]  # scheduled positions per request
    expected: tuple[int, ...]  # one slot per scheduled token, requests in order
    width: int = 8
    max_num_tokens: int = 0  # 0: T + 3, so a tail always exists
    cp_world_size: int = 1
    cp_rank: int = 0
    cp_interleave: int = 1
    extra_rows: int = 1  # table rows past N (must not be read)

    @property
    def num_tokens(self) -> int:
        return sum(len(p) for p in self.positions)

    @property
    def tmax(self) -> int:
        return self.max_num_tokens or self.num_tokens + 3

    def inputs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(query_start_loc int32, positions int64, block_table int32) as numpy arrays.
        Rows past N hold 2**31-1 so that reading them shows."""
        qsl = np.zeros(len(self.positions) + 1, dtype=np.int32)
        qsl[1:] = np.cumsum([len(p) for p in self.positions])
        pos = np.array([p for req in self.positions for p in req], dtype=np.int64)
        table = np.full((len(self.rows) + self.extra_rows, self.width), 2**31 - 1, dtype=np.int32)
        for r, row in enumerate(self.rows):
            table[r] = 0
            table[r, : len(row)] = row
        return qsl, pos, table

    def expected_mapping(self) -> np.ndarray:
        """The whole [Tmax] output: the hand-computed slots, then the -1 tail."""
        out = np.full(self.tmax, -1, dtype=np.int64)
        out[: self.num_tokens] = self.expected
        return out

    def kwargs(self) -> dict[str, int]:
        return dict(kv_block_size=self.kv_block_size, kernel_block_size=self.kernel_block_size,
                    cp_world_size=self.cp_world_size, cp_rank=self.cp_rank, cp_interleave=self.cp_interleave)

    def call(self) -> dict[str, Any]:
        """The example as a stateless slot-mapping call (slot/call.py): what `fuzz`
        runs first, and a slot-call case holds."""
        qsl, positions, table = self.inputs()
        return slot_call(self.name, self.kwargs(), qsl, positions, table, self.tmax)


def _ex6(rank: int, interleave: int) -> SlotExample:
    # W=8, K=B=16, row [0, 1, 2, 3], positions 0..15; VB = K*W = 128, so vbo = p.
    # I=1: owner = p % 8 and local l = p // 8 (col 0 -> block 0): rank k owns p=k at
    #      slot 0*16+0 = 0 and p=k+8 at slot 0*16+1 = 1.
    # I=16: owner = (p // 16) % 8 = 0 for every p < 16, l = p % 16 = p: rank 0 owns
    #      0..15 at slots 0..15; the other ranks own nothing.
    if interleave == 1:
        expected = tuple(0 if p == rank else 1 if p == rank + 8 else -1 for p in range(16))
    else:
        expected = tuple(range(16)) if rank == 0 else (-1,) * 16
    return SlotExample(
        name=f"spec4.6-W8-I{interleave}-rank{rank}", kv_block_size=16, kernel_block_size=16,
        rows=((0, 1, 2, 3),), positions=(tuple(range(16)),), expected=expected,
        cp_world_size=8, cp_rank=rank, cp_interleave=interleave)


SPEC_EXAMPLES: tuple[SlotExample, ...] = (
    # 1. B=K=16, row [5,6,7]: p=0 -> 5*16+0=80; 15 -> 5*16+15=95; 16 -> col 1: 6*16+0=96;
    #    47 -> col 2: 7*16+15=127.
    SlotExample("spec4.1-one-request", 16, 16, rows=((5, 6, 7),), positions=((0, 15, 16, 47),),
                expected=(80, 95, 96, 127)),
    # 2. rows [9,2] and [7,4]: request 0, p=3 -> 9*16+3=147; request 1, p=20 -> col 1: 4*16+4=68.
    SlotExample("spec4.2-two-requests", 16, 16, rows=((9, 2), (7, 4)), positions=((3,), (20,)),
                expected=(147, 68)),
    # 3. W=2, R=1, I=1, K=B=16, row [5,6]: VB=32; rank 1 owns odd vbo, l = vbo // 2.
    #    p=1 -> l=0: 80; p=3 -> l=1: 81; p=5 -> l=2: 82; even p -> -1;
    #    p=32 -> vbi=1, vbo=0: rank 0, -1; p=33 -> vbi=1, l=0, col=1: 6*16 = 96.
    SlotExample("spec4.3-dcp-rank1", 16, 16, rows=((5, 6),), positions=((0, 1, 2, 3, 4, 5, 32, 33),),
                expected=(-1, 80, -1, 81, -1, 82, -1, 96), cp_world_size=2, cp_rank=1),
    # 4. K=32, B=16 (P=2), allocation row [5,9] = kernel row [10,11,18,19]; col = p // 16:
    #    0 -> 10*16=160; 15 -> 175; 16 -> 11*16=176; 31 -> 191; 32 -> 18*16=288; 47 -> 303;
    #    48 -> 19*16=304.
    SlotExample("spec4.4-hybrid", 32, 16, rows=((10, 11, 18, 19),), positions=((0, 15, 16, 31, 32, 47, 48),),
                expected=(160, 175, 176, 191, 288, 303, 304)),
    # 5. 1030 tokens, row 1, 2, ..., 65 (cdiv(1030, 16) = 65 blocks), B=K=16: column c holds
    #    c+1, so slot = (p//16 + 1)*16 + p%16 = p + 16: 1023 -> 1039, 1024 -> 1040.
    #    Tmax 1040 leaves a 10-token tail of -1.
    SlotExample("spec4.5-1030-tokens", 16, 16, rows=(tuple(range(1, 66)),), positions=(tuple(range(1030)),),
                expected=tuple(p + 16 for p in range(1030)), width=128, max_num_tokens=1040),
    *(_ex6(rank, 1) for rank in range(8)),
    *(_ex6(rank, 16) for rank in range(8)),
    # 7. The design notes: B=16, 32 tokens in physical blocks 5 and 8, a third block appends
    #    physical 2. p=0 -> 80; 31 -> 8*16+15 = 143; 32 -> 2*16 = 32; 40 -> 2*16+8 = 40.
    SlotExample("spec4.7-design-notes", 16, 16, rows=((5, 8, 2),), positions=((0, 31, 32, 40),),
                expected=(80, 143, 32, 40)),
    # §4's ownership bug: K=128, B=64 (P=2), W=2, I=128; allocation row [3,7] = kernel
    # [6,7,14,15]; VB = 256. Rank 0: p=64 -> vbo 64, (64//128)%2 = 0, local, l=64, col=1:
    # 7*64 = 448; p=128 -> (128//128)%2 = 1: rank 1 owns it, -1 (the kernel-block formula,
    # VB = B*W = 128, calls it rank 0's and writes 448 again). Rank 1: p=128 -> l=0,
    # col 0: 6*64 = 384; p=64 -> -1.
    SlotExample("spec4-ownership-rank0", 128, 64, rows=((6, 7, 14, 15),), positions=((64, 128),),
                expected=(448, -1), cp_world_size=2, cp_rank=0, cp_interleave=128),
    SlotExample("spec4-ownership-rank1", 128, 64, rows=((6, 7, 14, 15),), positions=((64, 128),),
                expected=(-1, 384), cp_world_size=2, cp_rank=1, cp_interleave=128),
    # The int64 rule: block 2**31-1 times B=16 is 34359738352 (> 2**31); +5 -> 34359738357.
    SlotExample("spec4-int64-product", 16, 16, rows=((2**31 - 1,),), positions=((5,),),
                expected=(34359738357,)),
    # The out-of-row guard: width 2, B=K=16: p=31 -> col 1 (row[1]=4): 79; p=32 -> col 2 >= 2: -1.
    # Row 1 (past N) holds 2**31-1: a kernel reading past row 0 would not produce -1.
    SlotExample("spec4-out-of-row", 16, 16, rows=((3, 4),), positions=((31, 32),), expected=(79, -1), width=2),
    # Positions far past the row: width 2, K=B=16 (32 positions per row). p=2**31+3 and
    # p=2**62+1 -> columns 134217728 and 2**58, both >= 2: -1; p=17 -> col 1: 4*16+1 = 65.
    # (The tiled kernel clamps positions to the row's end to divide in 31 bits; these
    # must stay -1, not wrap into the row.)
    SlotExample("spec4-huge-positions", 16, 16, rows=((3, 4),), positions=((2**31 + 3, 17, 2**62 + 1),),
                expected=(-1, 65, -1), width=2),
    # A row that maps 2**31 positions or more: K=B=2**29, width 5 (5 * 2**29 positions).
    # p=2**30+7 -> col 2 (row[2]=3): 3 * 2**29 + 7 = 1610612743; p=5*2**29 -> col 5: -1;
    # p=2**29-1 -> col 0 (row[0]=1): 2**29 + 2**29 - 1 = 1073741823.
    SlotExample("spec4-row-past-2**31-positions", 2**29, 2**29, rows=((1, 2, 3, 4, 5),),
                positions=((2**30 + 7, 5 * 2**29, 2**29 - 1),), expected=(1610612743, -1, 1073741823), width=5),
    # An interleave that is no power of two: K=48, B=16 (P=3), W=2, I=3, rank 0, row [7, 8, 9];
    # VB = 96. p=3: chunk 3//3 = 1, 1 % 2 = 1: rank 1's, -1. p=6: chunk 2, 2 % 2 = 0: rank 0,
    # l = (6 // 6) * 3 + 6 % 3 = 3, col 0: 7*16+3 = 115. p=2: chunk 0, l=2: 7*16+2 = 114.
    # (A division by 3 that rounds 3//3 or 6//3 down, as a multiplier one short does, gives
    # p=3 a slot and p=6 none.)
    SlotExample("spec4-interleave-not-a-power-of-two", 48, 16, rows=((7, 8, 9),), positions=((3, 6, 2),),
                expected=(-1, 115, 114), width=3, cp_world_size=2, cp_rank=0, cp_interleave=3),
    # No more tokens than requests, but not token t in request t: request 0 is empty, so
    # token 0 is request 1's (row [2]): p=4 -> 2*16+4 = 36; token 1 is request 2's
    # (row [3]): p=5 -> 3*16+5 = 53. (A decode launch's guess "token t is request t" fails
    # here and must fall back to the search.)
    SlotExample("spec4-decode-with-an-empty-request", 16, 16, rows=((1,), (2,), (3,)), positions=((), (4,), (5,)),
                expected=(36, 53)),
    # N = 0: nothing scheduled, the whole output is tail.
    SlotExample("spec4-no-requests", 16, 16, rows=(), positions=(), expected=(), max_num_tokens=5),
    # N = 0 with a table of no rows at all: a lane with no token must read nothing.
    SlotExample("spec4-no-requests-no-rows", 16, 16, rows=(), positions=(), expected=(), max_num_tokens=5,
                extra_rows=0),
    # Request edges at tile ends, for every tile size dividing 1024: request 0 ends at
    # token 1022, so the last token of the tile [0, 1024) (or [768, 1024), ...) is
    # request 1's; request 1 then covers the whole tile [1024, 2048) and token 2048;
    # tokens 2049..2052 are request 2's, and Tmax leaves a 3-token tail. Lengths 1023,
    # 1026, 4; each request's positions run from 0. Row r holds 1000*r + c + 1 in
    # column c (65 columns: cdiv(1026, 16)), so with K=B=16
    # slot = (1000*r + p//16 + 1)*16 + p%16 = 16000*r + 16 + p.
    SlotExample("spec4-request-edges-at-tile-ends", 16, 16,
                rows=tuple(tuple(1000 * r + c + 1 for c in range(65)) for r in range(3)),
                positions=(tuple(range(1023)), tuple(range(1026)), tuple(range(4))),
                expected=tuple(16000 * r + 16 + p for r, n in enumerate((1023, 1026, 4)) for p in range(n)),
                width=65),
    # A zero-length request between two others; T = Tmax (no tail).
    # Request 0 row [1]: p=2 -> 18; request 1 empty; request 2 row [2]: p=0 -> 32.
    SlotExample("spec4-empty-request-and-T-equals-Tmax", 16, 16, rows=((1,), (9,), (2,)),
                positions=((2,), (), (0,)), expected=(18, 32), max_num_tokens=2),
    # A virtual block past 2**31 positions: K=B=2**30, W=4, I=1, row [7, 9]; VB = 2**32, so
    # a kernel must divide in 64 bits (the tiled kernel's plain division once wrapped K*W in
    # int32). p=2**32+6 -> vbi 1, vbo 6: rank 6 % 4 = 2, l = 6 // 4 = 1, col 1: 9*2**30+1.
    # p=3*2**30+3 -> vbo past 2**31: rank 3, l = 3*2**28, col 0: 7*2**30 + 3*2**28.
    # p=2**31+2 -> rank 2, l = 2**29, col 0: 7*2**30 + 2**29. p=5 -> rank 1.
    SlotExample("spec4-virtual-block-past-2**31-rank2", 2**30, 2**30, rows=((7, 9),),
                positions=((2**32 + 6, 3 * 2**30 + 3, 2**31 + 2, 5),), expected=(9663676417, -1, 8053063680, -1),
                width=2, cp_world_size=4, cp_rank=2),
    SlotExample("spec4-virtual-block-past-2**31-rank3", 2**30, 2**30, rows=((7, 9),),
                positions=((2**32 + 6, 3 * 2**30 + 3, 2**31 + 2, 5),), expected=(-1, 8321499136, -1, -1),
                width=2, cp_world_size=4, cp_rank=3),
)
