"""Every compilation of our KV kernels that the stateless KV modes' draws (kv/draw.py)
can ask for, made ahead by tiny calls: `blocktable warm --stateless`, and the
background of `fuzz --stateless --kv-…` on a GPU (properties/run/warm.py).

A stateless call draws its geometry afresh each time, so a run on a fresh host meets
a new variant every few calls and spends most of its first minutes compiling them,
about a third of a second each (docs/results.md). What tells the variants apart is
what the launch code (blocktable/kv.py) turns into compile-time constants or
specialized arguments:
- the head size D (with its power-of-two tile; a copy's row is D too: the caches are
  views cut to D), and the heads a program moves (H 1..4: all, or four of three);
- the dtypes the kernel sees: a bit copy ("auto") moves 16- or 32-bit integers, so
  float16 and bfloat16 are one variant; fp8 writes convert from each float type; an
  fp8 gather or copy sees uint8 whatever the data's dtype (and a gather writes
  float32);
- whether every pointer and stride is 16-aligned: with rows of D + pad elements, only
  where D + pad is a multiple of 16 (joint tensors and layouts move pointers by whole
  rows, and the index inputs are always aligned);
- the gather's search steps: up to 16 requests, or 17 to 64.
Two more are constant over the draws and pinned by the tests: every scale drawn takes
the fast division, and every cache's slots fit in int32. Block sizes, layouts and how
many blocks, tokens or pairs a call has only change arguments Triton leaves
unspecialized.

Each tiny call is a case-file call (kv/call.py) run through the same guarded buffers
a drawn call runs in, so its tensors are laid out as a drawn call's are, and it is
compared with the truth like one. tests/properties/kv/test_warm.py holds that seeded
draws ask for no variant that these calls do not make.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from blocktable.device import Backend
from blocktable.plugin import KVKernels
from blocktable.properties.kv.call import run_kv_call
from blocktable.properties.kv.draw import HEAD_SIZES, MAX_HEADS

# (dtype, cache dtype) of each variant the kernels can tell apart (see above).
WRITE_KINDS = (("float16", "auto"), ("float32", "auto"),
               ("float16", "fp8_e4m3"), ("bfloat16", "fp8_e4m3"), ("float32", "fp8_e4m3"))
GATHER_KINDS = COPY_KINDS = (("float16", "auto"), ("float32", "auto"), ("float16", "fp8_e4m3"))
REQUESTS = (1, 17)  # one gather per search-step count of 1..64 requests (4 and 8 steps)


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
    """Pads that give each alignment the head size allows: with none, a head size of
    a multiple of 16 has every stride a multiple of 16 (aligned), and a pad of one
    makes it unaligned; other head sizes are unaligned either way."""
    return (0, 1) if head_size % 16 == 0 else (0,)


@dataclasses.dataclass(frozen=True)
class StatelessKVCall:
    """Every variant of one head count and head size: a write per write kind, a
    gather per gather kind and search-step count, each per alignment; and with one
    head, the copies (a copy's variant does not depend on H)."""

    heads: int
    head_size: int

    def describe(self) -> str:
        return f"stateless KV H={self.heads} D={self.head_size}"

    def calls(self) -> Iterator[dict[str, Any]]:
        H, D = self.heads, self.head_size
        for pad in pads(D):
            for dtype, cache in WRITE_KINDS:
                yield write_call(H, D, dtype, cache, pad)
            for dtype, cache in GATHER_KINDS:
                for requests in REQUESTS:
                    yield gather_call(H, D, dtype, cache, pad, requests)
            if H == 1:
                for dtype, cache in COPY_KINDS:
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
