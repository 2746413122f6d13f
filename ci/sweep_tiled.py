"""Tile-size sweep for the tiled slot-mapping kernel (GPU): tokens per program x
warps on the bench shapes. Prints medians (µs, CUDA-graph replays) per shape."""

import torch
import triton
import triton.testing

from blocktable import device

device.select("cuda")
from blocktable.cli.bench import make_inputs  # noqa: E402
from blocktable.kernels.slot_mapping import slot_mapping_tiled  # noqa: E402

SHAPES = [("decode-256", 256, 1), ("decode-1024", 1024, 1), ("mixed-64x128", 64, 128), ("prefill-1x16384", 1, 16384),
          ("256x4096", 256, 4096), ("64x65536", 64, 65536)]
CONFIGS = [(128, 4), (256, 4), (256, 8), (512, 8), (512, 16), (1024, 16)]
for name, n, per in SHAPES:
    for W, I in [(1, 1), (4, 16)]:
        x = make_inputs(n, per, W, I, 0, "cuda")
        c = x["config"]
        out = torch.empty(x["T"], dtype=torch.int64, device="cuda")
        N, T = x["qsl"].numel() - 1, x["T"]
        line = [f"{name} W={W}:"]
        for block, warps in CONFIGS:
            def call():
                slot_mapping_tiled[(triton.cdiv(T, block),)](
                    x["qsl"], x["positions"], x["table"], x["table"].stride(0), out, N, T, T,
                    x["table"].shape[1], c["kv_block_size"], c["kernel_block_size"], c["cp_world_size"],
                    c["cp_rank"], c["cp_interleave"], SEARCH_STEPS=max(0, N - 1).bit_length(), BLOCK=block,
                    num_warps=warps)
            call()
            assert (out.cpu().numpy() == x["expected"]).all(), (name, block, warps)
            us = triton.testing.do_bench_cudagraph(call, rep=50, return_mode="median") * 1e3
            line.append(f"{block}/{warps}={us:.2f}")
        print(" ".join(line), flush=True)
