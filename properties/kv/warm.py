"""Every compilation of our KV kernels that the stateless KV modes' draws (kv/draw.py)
can ask for, made ahead by tiny calls: `blocktable warm --stateless`, and the
background of `fuzz --stateless --kv-…` on a GPU (properties/run/warm.py).

A stateless call draws its geometry afresh each time, so a run on a fresh host meets
a new variant every few calls and spends most of its first minutes compiling them,
about a third of a second each (docs/results.md). What tells the variants apart is
what the launch code (blocktable/kv.py) turns into compile-time constants or
specialized arguments: the head size (with its power-of-two tile), the heads a
program moves (H 1..4: all, or four of three), the dtypes the kernel sees (a bit
copy moves 16- or 32-bit integers; fp8 converts from each float type and decodes
to float32), the innermost row a copy moves (the head size plus the caches' pad),
whether every pointer and stride is 16-aligned, and the gather's search steps
(up to 16 requests, or 17 to 64). Scales, block sizes, layouts and how many blocks,
tokens or pairs a call has only change arguments Triton leaves unspecialized.

Each warm call is a small case-file call (kv/call.py) run through the same guarded
buffers a drawn call runs in, so its tensors are laid out as a drawn call's are.
tests/properties/kv/test_warm.py holds that seeded draws ask for no variant that
these calls do not make.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from blocktable.device import Backend
from blocktable.plugin import KVKernels
from blocktable.properties.kv.call import DTYPES, run_kv_call
from blocktable.properties.kv.draw import HEAD_SIZES

MAX_HEADS = 4  # kv/draw.py draws H from 1..4
CACHE_PADS = (0, 1, 3)  # kv/draw.py's pads of a cache's head rows: a copy's row is D + pad
REQUESTS = (1, 17)  # one gather per search-step count of 0..64 requests (4 and 8 steps)


def _base(op: str, heads: int, head_size: int, dtype: str, cache: str, pad: int) -> dict[str, Any]:
    """Two blocks of one slot, the caches' head rows padded by `pad`."""
    return {"op": op, "name": f"warm-{op}", "layout": "NHD", "dtype": dtype, "kv_cache_dtype": cache,
            "k_scale": 1.0, "v_scale": 1.0, "num_blocks": 2, "block_size": 1, "num_heads": heads,
            "head_size": head_size, "cache_form": {"joint": False, "pad": pad}, "fill_seed": 0}


def write_call(heads: int, head_size: int, dtype: str, cache: str, pad: int) -> dict[str, Any]:
    """One token written into slot 0, its key and value rows padded by `pad` too."""
    zeros = [0] * (heads * head_size)
    return dict(_base("write", heads, head_size, dtype, cache, pad), slot_mapping=[0], rows=1, key=zeros,
                value=zeros, input_form={"joint": False, "pad": pad})


def copy_call(heads: int, head_size: int, dtype: str, cache: str, pad: int) -> dict[str, Any]:
    return dict(_base("copy", heads, head_size, dtype, cache, pad), layers=1, block_mapping=[[0, 1]])


def gather_call(heads: int, head_size: int, dtype: str, cache: str, pad: int, requests: int) -> dict[str, Any]:
    """`requests` requests of one token each, through block 0."""
    return dict(_base("gather", heads, head_size, dtype, cache, pad), block_table=[[0]] * requests, width=1,
                cu_lens=list(range(requests + 1)), out_rows=requests, out_pad=pad)


def pads(head_size: int) -> tuple[int, ...]:
    """Pads that give both alignments: with none, a head size of a multiple of 16 has
    every stride a multiple of 16 (aligned); a pad of one makes it unaligned. Other
    head sizes are unaligned either way."""
    return (0, 1) if head_size % 16 == 0 else (0,)


@dataclasses.dataclass(frozen=True)
class StatelessKVCall:
    """Every variant of one head count and head size: a write and a gather per data
    dtype, cache dtype and alignment (and per search-step count for the gather), and
    the copies whose row is this head size plus each pad."""

    heads: int
    head_size: int

    def describe(self) -> str:
        return f"stateless KV H={self.heads} D={self.head_size}"

    def calls(self) -> Iterator[dict[str, Any]]:
        H, D = self.heads, self.head_size
        for dtype in DTYPES:
            for cache in ("auto", "fp8_e4m3"):
                for pad in pads(D):
                    yield write_call(H, D, dtype, cache, pad)
                    for requests in REQUESTS:
                        yield gather_call(H, D, dtype, cache, pad, requests)
                if H == 1:  # a copy's variant depends on its row alone (D + pad), not on H
                    for pad in CACHE_PADS:
                        yield copy_call(H, D, dtype, cache, pad)

    def launches(self, kernels: KVKernels, backend: Backend) -> Iterator[str]:
        for call in self.calls():
            outcome = run_kv_call(call, getattr(kernels, call["op"]), backend.device)
            if not outcome.passed:  # a tiny call our kernels get wrong: worth more than the warm
                raise AssertionError(f"{call['op']} of {self.describe()}: {outcome.error}")
            yield f"{call['op']} {call['dtype']} cache {call['kv_cache_dtype']} pad {call['cache_form']['pad']}"


def calls() -> list[StatelessKVCall]:
    """One call per head count and head size the draws take, the common sizes first."""
    sizes = sorted(HEAD_SIZES, key=lambda D: (D not in (64, 128), -D))
    return [StatelessKVCall(H, D) for D in sizes for H in range(1, MAX_HEADS + 1)]
