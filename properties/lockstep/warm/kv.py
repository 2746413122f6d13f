"""The KV kernels' compilations that the lockstep's KV worlds can ask for.

Triton compiles a kernel once per variant: per dtype of each tensor, per value of each
compile-time constant (the head size, the heads a program moves, the conversion, the
gather's search steps) and per pattern of the arguments it specializes. A KV world
draws its caches from a small space (strategies.kv_configs), yet a run on a fresh GPU
host meets enough of it to spend most of its first minute compiling on first use
(docs/results.md). Here every variant is made by a tiny copy, write and
gather of each kind of world, through our kernels and with tensors made as a world
makes them (kv.py), so that Triton's disk cache holds them before a run needs them:
the run then loads each one instead of compiling it.

What tells variants apart is read from the strategies' own constants: heads, head
size, dtype and cache dtype make the kinds of world; every scale a world draws is
written with (the write's exact-division flag depends on it); the gather runs once
per search-step count that a world's request slots (DCP ranks times requests) can
give. What a world draws besides (layout, padding, joint caches, block and batch
sizes) only changes arguments that Triton leaves unspecialized.
tests/properties/lockstep/test_warm.py holds that a seeded run asks for no variant
that these calls do not make.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import torch

from blocktable.device import Backend, upload
from blocktable.kv import search_steps
from blocktable.plugin import KVKernels
from blocktable.properties.kv.cache import cache_dtype, cache_pair, flat_size, kernel_options, out_dtype
from blocktable.properties.kv.data import HOST, to_device, token_data
from blocktable.properties.lockstep.kv import PAD_ROWS
from blocktable.properties.lockstep.strategies import (
    KV_CACHE_DTYPES,
    KV_DTYPES,
    KV_HEAD_SIZES,
    KV_HEADS,
    KV_SCALES,
    MAX_NUM_REQS,
    WORLD_SIZES,
)
from blocktable.properties.world import KVConfig


@dataclasses.dataclass(frozen=True)
class KVCall:
    """One kind of KV world, as its kernels see it: a copy, a write per scale, and a
    gather per request count."""

    kv: KVConfig
    scales: tuple[float, ...]
    requests: tuple[int, ...]

    def describe(self) -> str:
        kv = self.kv
        return f"KV world H={kv.num_heads} D={kv.head_size} {kv.dtype} cache {kv.kv_cache_dtype}"

    def launches(self, kernels: KVKernels, backend: Backend) -> Iterator[str]:
        """The call's kernel launches, one at a time (each yields what it launched): two
        blocks of one slot each, one token written, one gathered."""
        kv = self.kv
        blocks, block_size = 2, 1
        cells = flat_size(kv, blocks, block_size)
        host = np.zeros(cells, dtype=HOST[cache_dtype(kv)])
        impl = cache_pair(to_device(host, cache_dtype(kv), backend), kv, blocks, block_size)
        pairs = upload(torch.tensor([[0, 1]], dtype=torch.int64), backend)
        kernels.copy([impl.key], [impl.value], pairs)
        yield "copy"
        values = np.zeros(2, dtype=np.int64)  # one token and one padding row, as a step's keys have
        slots = upload(torch.tensor([0], dtype=torch.int64), backend)
        for scale in self.scales:
            scaled = dataclasses.replace(kv, k_scale=scale, v_scale=scale)
            key, value = (to_device(token_data(values, scaled, which), kv.dtype, backend) for which in (0, 1))
            kernels.write(key, value, impl.key, impl.value, slots, **kernel_options(scaled))
            yield f"write, scale {scale:g}"
        empty = np.zeros((1 + PAD_ROWS, kv.num_heads, kv.head_size), dtype=HOST[out_dtype(kv)])
        for n in self.requests:
            table = upload(torch.zeros((n, 1), dtype=torch.int32), backend)
            cu = upload(torch.from_numpy(np.minimum(np.arange(n + 1), 1).astype(np.int32)), backend)
            out_key, out_value = (to_device(empty, out_dtype(kv), backend) for _ in range(2))
            kernels.gather(impl.key, impl.value, table, cu, out_key, out_value, **kernel_options(kv))
            yield f"gather, {n} requests"


def request_counts() -> tuple[int, ...]:
    """One request count per search-step count a world's gather can pass: a group's
    gather covers every DCP rank's request slots."""
    most = max(WORLD_SIZES) * MAX_NUM_REQS
    return tuple(sorted({search_steps(n): n for n in range(1, most + 1)}.values()))


def calls() -> list[KVCall]:
    """Every kind of KV world the lockstep can draw."""
    requests = request_counts()
    made = []
    for heads in KV_HEADS:
        for head_size in KV_HEAD_SIZES:
            for dtype in KV_DTYPES:
                for cache in KV_CACHE_DTYPES:
                    scales = tuple(sorted(set(KV_SCALES))) if cache == "fp8_e4m3" else (1.0,)
                    kv = KVConfig(num_heads=heads, head_size=head_size, dtype=dtype, kv_cache_dtype=cache)
                    made.append(KVCall(kv, scales, requests))
    return made
