"""Tile sweep for the package's tiled slot-mapping kernels (GPU): tokens per program
x warps x search mode (per token, or whole tiles first), on the bench shapes, for `triton-tiled` (run-time sizes) and
`triton-specialized` (K, B, W, I compiled in). Each configuration is checked against
the vectorized reference before it is timed; medians of CUDA-graph replays, µs.

    python ci/sweep_tiled.py            # on a GPU machine with the package installed
"""

import functools

import torch
import triton
import triton.testing

from blocktable import device

device.select("cuda")
from blocktable.cli.bench import make_inputs  # noqa: E402
from blocktable.kernels import slot_mapping as kernels  # noqa: E402

SHAPES = [("decode-256", 256, 1), ("decode-1024", 1024, 1), ("mixed-64x128", 64, 128), ("prefill-1x16384", 1, 16384),
          ("prefill-8x2048", 8, 2048), ("256x4096", 256, 4096), ("64x65536", 64, 65536)]
CONFIGS = [(128, 4), (256, 4), (256, 8), (512, 4), (512, 8), (1024, 4), (1024, 8), (2048, 8)]
KERNELS = {"tiled": kernels.slot_mapping_tiled, "specialized": kernels.slot_mapping_tiled_specialized}



def launch(kernel, x, out, block, warps, whole):
    N, T, c = x["qsl"].numel() - 1, x["T"], x["config"]
    kernel[(triton.cdiv(T, block),)](
        x["qsl"], x["positions"], x["table"], x["table"].stride(0), out, N, T, T,
        x["table"].shape[1], c["kv_block_size"], c["kernel_block_size"], c["cp_world_size"],
        c["cp_rank"], c["cp_interleave"], SEARCH_STEPS=max(0, N - 1).bit_length(), BLOCK=block,
        WHOLE_TILES=whole, num_warps=warps)


for W, I in [(1, 1), (4, 16)]:
    for name, requests, per_request in SHAPES:
        x = make_inputs(requests, per_request, W, I, 0, "cuda")
        out = torch.empty(x["T"], dtype=torch.int64, device="cuda")
        for label, kernel in KERNELS.items():
            cells = []
            for (block, warps), whole in [(cfg, w) for w in (False, True) for cfg in CONFIGS]:
                call = functools.partial(launch, kernel, x, out, block, warps, whole)
                out.fill_(-7)
                call()
                assert (out.cpu().numpy() == x["expected"]).all(), (name, label, block, warps, whole)
                us = triton.testing.do_bench_cudagraph(call, rep=40, return_mode="median") * 1e3
                cells.append(f"{block}/{warps}{'w' if whole else ''}={us:.2f}")
            print(f"W={W} {name:>16} {label:>11}: " + " ".join(cells), flush=True)
