"""Timing a kernel call on the device, and the device's copy bandwidth: what every
benchmark of `blocktable bench` measures against."""

from __future__ import annotations

import time
from collections.abc import Callable


def time_call(fn: Callable[[], None], cuda: bool) -> tuple[float, str]:
    """Median microseconds: CUDA-graph replays on a GPU (plain launches if the kernel
    cannot be captured), wall time under the interpreter."""
    if not cuda:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e6, "interpreter wall time, not a timing"
    import torch
    import triton.testing

    try:
        ms = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
        return ms * 1e3, ""
    except Exception as e:  # e.g. a plug-in that synchronises cannot be captured
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
        return ms * 1e3, f"no CUDA graph ({type(e).__name__}): plain launches"


def copy_bandwidth(cuda: bool) -> float | None:
    """Device-to-device copy, bytes read + written per second (GB/s)."""
    if not cuda:
        return None
    import torch
    import triton.testing

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() / (ms * 1e-3) / 1e9
