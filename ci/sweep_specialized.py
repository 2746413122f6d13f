"""Tile sweep for the specialized tiled kernel (GPU): tokens per program x warps,
checked against the vectorized reference, medians of CUDA-graph replays (µs)."""

import torch
import triton
import triton.testing

from blocktable import device

device.select("cuda")
from blocktable.cli.bench import make_inputs  # noqa: E402
from blocktable.kernels.slot_mapping import slot_mapping_tiled_specialized as kernel  # noqa: E402

SHAPES = [("decode-1024", 1024, 1), ("mixed-64x128", 64, 128), ("256x4096", 256, 4096), ("64x65536", 64, 65536)]
CONFIGS = [(128, 4), (256, 4), (256, 8), (512, 4), (512, 8), (1024, 4), (1024, 8), (2048, 8)]
for W, I in [(1, 1), (4, 16)]:
    for name, n, per in SHAPES:
        x = make_inputs(n, per, W, I, 0, "cuda")
        c = x["config"]
        out = torch.empty(x["T"], dtype=torch.int64, device="cuda")
        N, T = x["qsl"].numel() - 1, x["T"]
        cells = []
        for block, warps in CONFIGS:
            def call():
                kernel[(triton.cdiv(T, block),)](
                    x["qsl"], x["positions"], x["table"], x["table"].stride(0), out, N, T, T, x["table"].shape[1],
                    c["kv_block_size"], c["kernel_block_size"], c["cp_world_size"], c["cp_rank"], c["cp_interleave"],
                    SEARCH_STEPS=max(0, N - 1).bit_length(), BLOCK=block, num_warps=warps)
            out.fill_(-7)
            call()
            assert (out.cpu().numpy() == x["expected"]).all(), (name, block, warps)
            cells.append(f"{block}/{warps}={triton.testing.do_bench_cudagraph(call, rep=40, return_mode='median') * 1e3:.2f}")
        print(f"W={W} {name:>14}: " + " ".join(cells), flush=True)
